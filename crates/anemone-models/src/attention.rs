//! The causal attention rule, once: which KV slots a query sees. The fp32 reference applies it
//! directly ([`visible_slots`]); the ANE graph receives it as the additive `mask` input the host
//! builds with [`causal_mask`] (converter tests and the runtime alike).

/// Slots `0..visible_slots(first_position, query)` are what query `query` of a batch written at
/// slots `first_position..` attends to: every earlier token and itself.
pub fn visible_slots(first_position: usize, query: usize) -> usize {
    first_position + query + 1
}

/// The first slot query `query` of a batch written at slots `first_position..` sees: 0, or under
/// a sliding window of `window` positions (the query's own included, as transformers'
/// `kv_idx > q_idx - sliding_window` and llama.cpp's standard SWA) the oldest one in the window.
pub fn first_visible_slot(first_position: usize, query: usize, window: Option<usize>) -> usize {
    match window {
        Some(w) => visible_slots(first_position, query).saturating_sub(w),
        None => 0,
    }
}

/// [`causal_mask`] for a sliding-window layer: also `hidden` on the slots before each query's
/// [`first_visible_slot`].
pub fn sliding_mask(
    context: usize,
    first_position: usize,
    t: usize,
    window: usize,
    hidden: f32,
) -> Vec<f32> {
    let mut mask = causal_mask(context, first_position, t, hidden);
    for i in 0..t {
        let start = first_visible_slot(first_position, i, Some(window)).min(context);
        mask[i * context..i * context + start].fill(hidden);
    }
    mask
}

/// The additive mask `[1, 1, t, slots]` of a sliding-window layer whose keys live in a ring of
/// `slots` slots (position `p` in slot `p mod slots`), for `t` tokens at positions
/// `first_position..`: 0 on the slots of the `window` latest positions up to each query (its
/// own included), `hidden` elsewhere. Each visible position is still in its slot after the batch
/// is written when `slots >= window + t - 1` (the oldest position query 0 sees,
/// `first_position + 1 - window`, is overwritten only by position `first_position + 1 - window
/// + slots`, later than the batch's last, `first_position + t - 1`).
pub fn ring_mask(
    slots: usize,
    first_position: usize,
    t: usize,
    window: usize,
    hidden: f32,
) -> Vec<f32> {
    debug_assert!(
        slots + 1 >= window + t,
        "ring of {slots} slots, window {window}, batch {t}"
    );
    let mut mask = vec![hidden; t * slots];
    for i in 0..t {
        let end = visible_slots(first_position, i);
        let start = first_visible_slot(first_position, i, Some(window));
        for position in start..end {
            mask[i * slots + position % slots] = 0.0;
        }
    }
    mask
}

/// The additive `mask` `[1, 1, t, context]` (row-major) for `t` tokens written at slots
/// `first_position..first_position + t`: 0 on the [`visible_slots`] of each query, `hidden` on
/// every other slot (later tokens, unfilled cache). `hidden` is finite (the manifest's
/// `mask_value`, −1e4) so fp16 softmax never sees −inf.
pub fn causal_mask(context: usize, first_position: usize, t: usize, hidden: f32) -> Vec<f32> {
    let mut mask = vec![hidden; t * context];
    for i in 0..t {
        let visible = visible_slots(first_position, i).min(context);
        mask[i * context..i * context + visible].fill(0.0);
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_is_causal_over_the_cache() {
        let h = -1e4;
        let m = causal_mask(8, 3, 2, h);
        assert_eq!(&m[..8], &[0., 0., 0., 0., h, h, h, h]);
        assert_eq!(&m[8..], &[0., 0., 0., 0., 0., h, h, h]);
    }

    #[test]
    fn mask_hides_future_and_unfilled_slots() {
        let m = causal_mask(6, 2, 2, -1e4);
        assert_eq!(&m[..6], &[0., 0., 0., -1e4, -1e4, -1e4]);
        assert_eq!(&m[6..], &[0., 0., 0., 0., -1e4, -1e4]);
    }

    #[test]
    fn sliding_mask_keeps_the_last_window_positions() {
        let h = -1e4;
        // window 2: position 3 sees 2..=3, position 4 sees 3..=4
        let m = sliding_mask(6, 3, 2, 2, h);
        assert_eq!(&m[..6], &[h, h, 0., 0., h, h]);
        assert_eq!(&m[6..], &[h, h, h, 0., 0., h]);
        // a window wider than the history hides nothing more than the causal mask
        assert_eq!(sliding_mask(6, 1, 2, 8, h), causal_mask(6, 1, 2, h));
    }

    /// Positions written into a ring by the rule the graph and the runtime follow (a batch of
    /// `t` at slot `first mod slots`, padding columns included; a batch that would straddle the
    /// ring's end runs one token at a time), then each real query's visible slots read back:
    /// exactly the positions of its window, with `slots = window + t - 1`, the bound.
    #[test]
    fn ring_mask_shows_each_query_exactly_its_window() {
        const PAD: usize = usize::MAX;
        for (window, t) in [(1, 1), (4, 1), (4, 8), (3, 5), (7, 2), (2, 6)] {
            let slots = window + t - 1;
            let mut ring: Vec<Option<usize>> = vec![None; slots];
            let mut first = 0;
            let mut batch = 0;
            while first < 6 * slots {
                let n = if first % slots + t <= slots { t } else { 1 };
                // every third batch is padded: only the first n - 1 columns are real
                let real = if batch % 3 == 2 && n > 1 { n - 1 } else { n };
                for i in 0..n {
                    ring[(first + i) % slots] = Some(if i < real { first + i } else { PAD });
                }
                let mask = ring_mask(slots, first, n, window, -1e4);
                for i in 0..real {
                    let q = first + i;
                    let mut seen: Vec<usize> = (0..slots)
                        .filter(|&s| mask[i * slots + s] == 0.0)
                        .map(|s| ring[s].expect("a visible slot was written"))
                        .collect();
                    seen.sort();
                    let want: Vec<usize> = (q + 1 - window.min(q + 1)..=q).collect();
                    assert_eq!(seen, want, "window {window}, t {t}, query at {q}");
                }
                first += real;
                batch += 1;
            }
        }
    }

    #[test]
    fn a_full_cache_shows_every_slot() {
        assert_eq!(causal_mask(3, 5, 1, -1e4), vec![0.0; 3]);
    }
}
