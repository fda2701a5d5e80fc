//! Where a chunk's KV states keep each layer's keys and values, and how the host addresses them.
//!
//! Layers without a window keep every position: slot = position, `context` slots. Sliding-window
//! layers (Gemma 3's local layers, every layer of a Phi-3 with `sliding_window`) keep a ring of
//! `window + prefill_len` slots (rounded up to [`STATE_ALIGN`]) when that is smaller than the
//! context: position `p` lives in slot `p mod slots`, and the mask over the slots shows each
//! query the slots of its window ([`crate::attention::ring_mask`]). A batch of `t` tokens never
//! overwrites a key an earlier query of the same batch still sees as long as
//! `slots >= window + t - 1`; a prefill window never straddles the ring's end (the runtime runs
//! such tokens through `decode`, see [`KvLayout::prefill_fits`]).
//!
//! Gemma (per-layer windows, own RoPE base) keeps its sliding layers in their own states
//! (`kv_cache_local`, or `k_cache_local` / `v_cache_local`) written at `position_local`; a model
//! whose every layer slides (Phi-3) uses the ordinary states, inputs and `position`, all over
//! the ring. Bundles written before rings existed (`local_kv_slots` absent from the manifest)
//! hold every layer at full context; [`KvLayout`] with `ring_slots: None` describes them.

use anemone_checkpoint::DecoderConfig;

use super::options::{ChunkOptions, STATE_ALIGN};

/// The KV geometry of a bundle (the same for all its chunks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Positions a session holds (slots of the states of layers without a window).
    pub context: usize,
    /// The sliding-window layers' window, if the model has any.
    pub window: Option<usize>,
    /// Slots of the sliding layers' ring; `None`: they keep full-context states with a sliding
    /// mask.
    pub ring_slots: Option<usize>,
    /// Gemma: sliding layers have their own inputs (`*_local`) and states.
    pub local_group: bool,
}

/// Which inputs and states a layer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerGroup {
    /// `cos`, `sin`, `mask`, `position` and the `kv_cache` (or `k_cache`/`v_cache`) states.
    Main,
    /// Gemma's sliding layers: `cos_local`, `sin_local`, `mask_local`, and with a ring
    /// `position_local` and their own states.
    Local,
}

impl KvLayout {
    /// The ring a conversion builds: `window + prefill_len` rounded up to [`STATE_ALIGN`], when
    /// it is smaller than the context.
    pub fn for_conversion(config: &DecoderConfig, options: &ChunkOptions) -> Self {
        let window = config.window();
        let ring_slots = window
            .map(|w| (w + options.prefill_len).div_ceil(STATE_ALIGN) * STATE_ALIGN)
            .filter(|&s| s < options.context);
        Self::new(config, options.context, ring_slots)
    }

    /// The layout of a bundle whose manifest records `ring_slots`.
    pub fn new(config: &DecoderConfig, context: usize, ring_slots: Option<usize>) -> Self {
        KvLayout {
            context,
            window: config.window(),
            ring_slots,
            local_group: config.gemma.is_some(),
        }
    }

    /// The group of `layer`.
    pub fn group(&self, config: &DecoderConfig, layer: usize) -> LayerGroup {
        if self.local_group && config.sliding_window(layer).is_some() {
            LayerGroup::Local
        } else {
            LayerGroup::Main
        }
    }

    /// Whether the layers of `group` keep a ring.
    pub fn is_ring(&self, group: LayerGroup) -> bool {
        self.ring_slots.is_some()
            && match group {
                LayerGroup::Local => true,
                // a model whose every layer slides
                LayerGroup::Main => !self.local_group && self.window.is_some(),
            }
    }

    /// Slots of the states (and the mask's last dim) of `group`.
    pub fn slots(&self, group: LayerGroup) -> usize {
        match self.ring_slots {
            Some(s) if self.is_ring(group) => s,
            _ => self.context,
        }
    }

    /// Whether `group` has its own states (else its layers share the main ones).
    pub fn own_states(&self, group: LayerGroup) -> bool {
        match group {
            LayerGroup::Main => true,
            LayerGroup::Local => self.is_ring(LayerGroup::Local),
        }
    }

    /// The state group a layer's K/V rows live in.
    pub fn state_group(&self, config: &DecoderConfig, layer: usize) -> LayerGroup {
        match self.group(config, layer) {
            LayerGroup::Local if self.own_states(LayerGroup::Local) => LayerGroup::Local,
            _ => LayerGroup::Main,
        }
    }

    /// The slot a token at `position` is written to in the states of `group`.
    pub fn slot(&self, group: LayerGroup, position: usize) -> usize {
        position % self.slots(group)
    }

    /// Whether `t` tokens (padding included) at `first..` can be written in one call: inside the
    /// context, and not across the end of a ring.
    pub fn prefill_fits(&self, first: usize, t: usize) -> bool {
        first + t <= self.context && self.ring_slots.is_none_or(|s| first % s + t <= s)
    }

    /// Checks a recorded ring against the prefill length it must hold.
    pub fn check(&self, prefill_len: usize) -> Result<(), String> {
        let Some(slots) = self.ring_slots else {
            return Ok(());
        };
        let Some(window) = self.window else {
            return Err(format!(
                "local_kv_slots {slots} is recorded but no layer has a sliding window"
            ));
        };
        if slots + 1 < window + prefill_len || slots > self.context {
            return Err(format!(
                "local_kv_slots {slots} must be at least window {window} + prefill_len \
                 {prefill_len} - 1 and at most the context {}",
                self.context
            ));
        }
        Ok(())
    }
}
