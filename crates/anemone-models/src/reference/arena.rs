//! One zeroed allocation holding the reference's large f32 matrices back to back, filled in place
//! by the checkpoint's dequantizers (no second copy of any weight is ever made).
//!
//! On Linux the allocation is an anonymous map whose pages are prefaulted in parallel before the
//! dequantizers write (`MADV_POPULATE_WRITE`: no page-fault trap per 4 KiB, a 0.5B model has
//! ~600 000). Elsewhere it is a plain `Vec<f32>`.

/// Where a matrix lies in its [`Arena`], in f32 elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    start: usize,
    len: usize,
}

/// Plans an arena: hands out spans, each starting on a 64-byte boundary (so rows of a
/// multiple-of-16 width never straddle a cache line).
#[derive(Debug, Default)]
pub struct Layout {
    end: usize,
}

/// f32 elements per 64-byte cache line.
const LINE: usize = 16;

impl Layout {
    pub fn span(&mut self, len: usize) -> Span {
        let start = self.end.next_multiple_of(LINE);
        self.end = start + len;
        Span { start, len }
    }
}

pub struct Arena {
    storage: Storage,
}

enum Storage {
    #[cfg(target_os = "linux")]
    Map {
        map: memmap2::MmapMut,
        /// Byte offset of element 0 in `map` (a 2 MiB boundary).
        offset: usize,
        /// f32 elements from `offset` on.
        len: usize,
    },
    #[cfg_attr(target_os = "linux", allow(dead_code))]
    Heap(Vec<f32>),
}

/// Alignment of element 0 (a huge-page boundary).
#[cfg(target_os = "linux")]
const MAP_ALIGN: usize = 2 << 20;
/// Bytes prefaulted per task.
#[cfg(target_os = "linux")]
const POPULATE_CHUNK: usize = 32 << 20;

impl Arena {
    /// A zeroed arena for every span `layout` handed out, its whole 2 MiB pages advised for
    /// transparent huge pages if `huge_pages` ([`anemone_mil::huge_pages::advise_anonymous`]).
    pub fn new(layout: &Layout, huge_pages: bool) -> Self {
        let len = layout.end.next_multiple_of(LINE);
        #[cfg(not(target_os = "linux"))]
        let _ = huge_pages;
        #[cfg(target_os = "linux")]
        {
            if let Some(storage) = Self::aligned_map(len, huge_pages) {
                return Self { storage };
            }
        }
        Self {
            storage: Storage::Heap(vec![0.0; len]),
        }
    }

    /// An anonymous map of `len` f32 with element 0 on a 2 MiB boundary, its pages prefaulted.
    /// `None` if the map fails (the caller falls back to the heap).
    #[cfg(target_os = "linux")]
    fn aligned_map(len: usize, huge_pages: bool) -> Option<Storage> {
        use rayon::prelude::*;
        let bytes = len.checked_mul(std::mem::size_of::<f32>())?;
        let map = memmap2::MmapMut::map_anon(bytes.checked_add(MAP_ALIGN)?).ok()?;
        let offset = (map.as_ptr() as usize).next_multiple_of(MAP_ALIGN) - map.as_ptr() as usize;
        if huge_pages {
            anemone_mil::huge_pages::advise_anonymous(&map, offset..offset + bytes);
        }
        // prefault the pages in the kernel, in parallel (no page-fault trap per 4 KiB during
        // the load); advice the kernel may refuse, in which case the pages fault in on first write
        (0..bytes.div_ceil(POPULATE_CHUNK))
            .into_par_iter()
            .for_each(|c| {
                let len = POPULATE_CHUNK.min(bytes - c * POPULATE_CHUNK);
                let at = offset + c * POPULATE_CHUNK;
                if let Err(e) = map.advise_range(memmap2::Advice::PopulateWrite, at, len) {
                    tracing::debug!(error = %e, "reference weights fault in on first write");
                }
            });
        Some(Storage::Map { map, offset, len })
    }

    pub fn get(&self, span: Span) -> &[f32] {
        &self.all()[span.start..span.start + span.len]
    }

    pub fn get_mut(&mut self, span: Span) -> &mut [f32] {
        &mut self.all_mut()[span.start..span.start + span.len]
    }

    fn all(&self) -> &[f32] {
        match &self.storage {
            #[cfg(target_os = "linux")]
            Storage::Map { map, offset, len } => {
                // SAFETY: the map holds `offset + len · 4` bytes (see `aligned_map`), page-aligned
                // plus a multiple of 2 MiB, so f32-aligned; anonymous maps start zeroed, and
                // every bit pattern is an f32.
                unsafe { std::slice::from_raw_parts(map.as_ptr().add(*offset).cast::<f32>(), *len) }
            }
            Storage::Heap(v) => v,
        }
    }

    fn all_mut(&mut self) -> &mut [f32] {
        match &mut self.storage {
            #[cfg(target_os = "linux")]
            Storage::Map { map, offset, len } => {
                // SAFETY: as in `all`; `&mut self` makes the borrow unique.
                unsafe {
                    std::slice::from_raw_parts_mut(
                        map.as_mut_ptr().add(*offset).cast::<f32>(),
                        *len,
                    )
                }
            }
            Storage::Heap(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_line_aligned_disjoint_and_zeroed() {
        let mut layout = Layout::default();
        let spans: Vec<Span> = [5usize, 0, 16, 33, 1 << 20]
            .iter()
            .map(|&n| layout.span(n))
            .collect();
        let mut arena = Arena::new(&layout, false);
        for (i, &s) in spans.iter().enumerate() {
            assert_eq!(s.start % LINE, 0);
            assert!(arena.get(s).iter().all(|&v| v == 0.0));
            arena.get_mut(s).fill(i as f32 + 1.0);
        }
        for (i, &s) in spans.iter().enumerate() {
            assert!(
                arena.get(s).iter().all(|&v| v == i as f32 + 1.0),
                "span {i}"
            );
            #[cfg(target_os = "linux")]
            assert_eq!(arena.get(s).as_ptr() as usize % 64, 0);
        }
    }
}
