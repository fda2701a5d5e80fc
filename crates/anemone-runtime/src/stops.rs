//! Stop strings over streamed text: text is released only when it cannot be the start of a stop
//! string, and generation ends at the first stop string, which is never released.

/// Text released so far and held back, for one generation.
#[derive(Debug, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
}

impl StopFilter {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Adds generated text; returns what may be released now and whether a stop string was
    /// reached (then nothing after it is ever released).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.pending.push_str(text);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            self.stopped = true;
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        let keep = self.held_suffix_len();
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Whatever is still held back once generation ends without a stop string.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.pending)
    }

    /// Bytes at the end of `pending` that are a proper prefix of some stop string.
    fn held_suffix_len(&self) -> usize {
        let mut keep = 0;
        for stop in &self.stops {
            for (i, _) in self.pending.char_indices() {
                let tail = &self.pending[i..];
                if tail.len() < stop.len() && stop.starts_with(tail) {
                    keep = keep.max(tail.len());
                    break;
                }
            }
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_before_a_stop_string_is_released_and_the_stop_never_is() {
        let mut f = StopFilter::new(&["END".to_string()]);
        assert_eq!(f.push("hello E"), ("hello ".to_string(), false));
        assert_eq!(f.push("N"), (String::new(), false));
        assert_eq!(f.push("D and more"), (String::new(), true));
        assert_eq!(f.finish(), "");
        let mut f = StopFilter::new(&["END".to_string()]);
        assert_eq!(f.push("a E"), ("a ".to_string(), false));
        assert_eq!(f.push("x"), ("Ex".to_string(), false));
        assert_eq!(f.push("é E"), ("é ".to_string(), false));
        assert_eq!(f.finish(), "E");
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        let mut f = StopFilter::new(&["bb".to_string(), "a".to_string(), String::new()]);
        assert_eq!(f.push("xbba"), ("x".to_string(), true));
    }
}
