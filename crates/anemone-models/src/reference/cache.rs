//! The KV cache: per layer, keys (after RoPE) and values of every position so far, row-major
//! `[position, kv_dim]`.

pub struct KvCache {
    kv_dim: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
}

impl KvCache {
    pub fn new(layers: usize, kv_dim: usize) -> Self {
        Self {
            kv_dim,
            keys: vec![Vec::new(); layers],
            values: vec![Vec::new(); layers],
            len: 0,
        }
    }

    /// Positions committed (every layer holds this many rows once a forward completes).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn clear(&mut self) {
        self.keys.iter_mut().for_each(Vec::clear);
        self.values.iter_mut().for_each(Vec::clear);
        self.len = 0;
    }

    /// Appends `[n, kv_dim]` keys and values to `layer`.
    pub fn append(&mut self, layer: usize, keys: &[f32], values: &[f32]) {
        debug_assert_eq!(keys.len() % self.kv_dim, 0);
        self.keys[layer].extend_from_slice(keys);
        self.values[layer].extend_from_slice(values);
    }

    /// `(keys, values)` of `layer`, each `[positions, kv_dim]`.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.keys[layer], &self.values[layer])
    }

    /// Marks `n` more positions as committed after every layer appended them.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.keys.iter().all(|k| k.len() == self.len * self.kv_dim));
    }
}
