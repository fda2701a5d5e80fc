//! Immutable shared bytes of constant data: a heap buffer, or a range of a read-only map of a
//! package's weight file (so a package read from disk costs no copy of its weights, and only
//! the pages in use are resident).

use std::ops::{Deref, Range};
use std::sync::Arc;

/// Cloning shares the bytes. Equality and hashing are by content (as for `Arc<[u8]>`);
/// [`SharedBytes::same_storage`] tells whether two values are the very same bytes.
#[derive(Clone)]
pub struct SharedBytes(Repr);

#[derive(Clone)]
enum Repr {
    Heap(Arc<[u8]>),
    Mapped {
        map: Arc<memmap2::Mmap>,
        range: Range<usize>,
    },
}

impl SharedBytes {
    /// The whole of a read-only file map.
    pub fn mapped(map: Arc<memmap2::Mmap>) -> Self {
        let range = 0..map.len();
        SharedBytes(Repr::Mapped { map, range })
    }

    /// Bytes `range` of these, sharing them (no copy); `None` if `range` is out of bounds.
    pub fn slice(&self, range: Range<usize>) -> Option<Self> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        Some(SharedBytes(match &self.0 {
            Repr::Heap(bytes) => Repr::Heap(Arc::from(&bytes[range])),
            Repr::Mapped { map, range: outer } => Repr::Mapped {
                map: Arc::clone(map),
                range: outer.start + range.start..outer.start + range.end,
            },
        }))
    }

    /// Whether `self` and `other` are the same bytes in memory (not merely equal contents).
    pub fn same_storage(&self, other: &Self) -> bool {
        let (a, b): (&[u8], &[u8]) = (self, other);
        std::ptr::eq(a.as_ptr(), b.as_ptr()) && a.len() == b.len()
    }

    /// The address of the first byte (identifies the storage, with the length).
    pub fn addr(&self) -> usize {
        self.as_ptr() as usize
    }

    /// Takes mapped bytes' pages (the whole pages inside them) out of the process's resident
    /// memory, for bytes their holder has read once and keeps in another form: the pages stay
    /// mapped and are read from the file again if touched. Heap bytes, and platforms without
    /// `madvise`, keep theirs. A hint: failure changes nothing.
    pub fn release_pages(&self) {
        #[cfg(unix)]
        if let Repr::Mapped { map, range } = &self.0 {
            let page = crate::huge_pages::page_size();
            let base = map.as_ptr() as usize;
            let start = (base + range.start).next_multiple_of(page) - base;
            let end = (base + range.end) / page * page - base;
            if end > start {
                // SAFETY: a read-only map of a file that is never written while mapped (the
                // contract of every map made here): dropped pages are read back from the file,
                // the same bytes, so no reader of the map can tell.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match &self.0 {
            Repr::Heap(_) => "heap",
            Repr::Mapped { .. } => "mapped",
        };
        write!(f, "SharedBytes({} bytes, {place})", self.len())
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Heap(bytes) => bytes,
            Repr::Mapped { map, range } => &map[range.clone()],
        }
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SharedBytes {}

impl std::hash::Hash for SharedBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl From<Arc<[u8]>> for SharedBytes {
    fn from(bytes: Arc<[u8]>) -> Self {
        SharedBytes(Repr::Heap(bytes))
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(bytes: Vec<u8>) -> Self {
        SharedBytes(Repr::Heap(bytes.into()))
    }
}

impl From<&[u8]> for SharedBytes {
    fn from(bytes: &[u8]) -> Self {
        SharedBytes(Repr::Heap(bytes.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `content` written to a temporary file, mapped.
    fn mapped_copy(content: &[u8]) -> SharedBytes {
        let file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut &file, content).unwrap();
        // SAFETY: the temporary file is private to this test and not written again.
        SharedBytes::mapped(Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap()))
    }

    #[test]
    fn mapped_and_heap_bytes_slice_and_compare_alike() {
        let content: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let mapped = mapped_copy(&content);
        let heap = SharedBytes::from(content.clone());
        assert_eq!(mapped, heap);
        let (m, h) = (
            mapped.slice(100..612).unwrap(),
            heap.slice(100..612).unwrap(),
        );
        assert_eq!(&*m, &content[100..612]);
        assert_eq!(m, h);
        assert!(m.same_storage(&m.clone()));
        assert!(!m.same_storage(&h));
        assert_eq!(&*m.slice(12..20).unwrap(), &content[112..120]);
        assert!(mapped.slice(10..1001).is_none());
        assert!(heap.slice(1001..1002).is_none());
    }

    #[test]
    fn mapped_bytes_read_the_same_after_their_pages_are_released() {
        let content: Vec<u8> = (0..=250u8).cycle().take(200_000).collect();
        let mapped = mapped_copy(&content);
        let part = mapped.slice(5_000..150_003).unwrap();
        assert_eq!(&*part, &content[5_000..150_003]);
        part.release_pages();
        mapped.slice(0..10).unwrap().release_pages();
        assert_eq!(&*part, &content[5_000..150_003]);
        assert_eq!(&*mapped, &content[..]);
        let heap = SharedBytes::from(content.clone());
        heap.release_pages();
        assert_eq!(&*heap, &content[..]);
    }
}
