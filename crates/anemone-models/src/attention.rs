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

    #[test]
    fn a_full_cache_shows_every_slot() {
        assert_eq!(causal_mask(3, 5, 1, -1e4), vec![0.0; 3]);
    }
}
