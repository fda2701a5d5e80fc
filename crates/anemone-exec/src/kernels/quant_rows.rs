//! The passes of a matvec over the AVX-512 kernels of `quant_avx512.rs`: rows four a pass
//! (the rest one at a time), the kernels chosen once per weight from its first row's layout,
//! each row's value [`super::dot`]'s whichever pass it shares. Rows come as [`Row`]s from any
//! function ([`dots`]) or, for a whole [`Weight`], as their raw parts found by arithmetic
//! ([`dots_weight`]: no per-row slicing).

use super::super::{Row, Split, Weight};
use super::{dot, kernel, parts, split, Kernel, Parts};

/// The kernels of one layout: four rows a pass, one row, and the split kernels
/// ([`split::kernels`]) where the layout has them.
struct Kernels {
    k4: Kernel<4>,
    k1: Kernel<1>,
    s4: Option<[Kernel<4>; 2]>,
    s1: Option<[Kernel<1>; 2]>,
}

impl Kernels {
    /// The kernels of `first`'s layout where each is one function of the layout alone (else
    /// `None`: rows go through [`dot`]).
    fn of(first: &Row, fp16: bool) -> Option<Self> {
        Some(Kernels {
            k4: kernel::<4>(first, fp16)?,
            k1: kernel::<1>(first, fp16)?,
            s4: split::kernels::<4>(first),
            s1: split::kernels::<1>(first),
        })
    }
}

/// `dst[r] = dot(row_of(start + r), x)` for every `r`, four rows a pass (the rest one at a
/// time), each row's value [`dot`]'s; the kernels chosen once from `first`'s layout. `false`
/// (and `dst` unspecified) when `row_of` returns `None` for a row.
///
/// # Safety
/// As [`dot`] for `first` and every row `row_of` returns (covered, `first`'s layout, `x.len()`
/// elements).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn dots<'w>(
    first: &Row,
    row_of: impl Fn(usize) -> Option<Row<'w>>,
    start: usize,
    dst: &mut [f32],
    x: &[f32],
    fp16: bool,
) -> bool {
    match Kernels::of(first, fp16) {
        Some(k) => passes(
            &k,
            first.per(),
            |i| row_of(i).map(|r| (parts(&r), split::level(&r))),
            start,
            dst,
            x,
        ),
        None => {
            let mut groups = dst.chunks_exact_mut(4);
            let mut i = start;
            for out in groups.by_ref() {
                let (Some(a), Some(b), Some(c), Some(d)) =
                    (row_of(i), row_of(i + 1), row_of(i + 2), row_of(i + 3))
                else {
                    return false;
                };
                out.copy_from_slice(&dot(&[a, b, c, d], x, fp16));
                i += 4;
            }
            for d in groups.into_remainder() {
                let Some(row) = row_of(i) else {
                    return false;
                };
                *d = dot(&[row], x, fp16)[0];
                i += 1;
            }
            true
        }
    }
}

/// [`dots`] of rows `start..start + dst.len()` of `w`, their parts found by arithmetic from
/// the weight's (the range checked once).
///
/// # Safety
/// As [`dot`] for `first`, row 0 of `w` (covered, `x.len()` elements): every row of a
/// [`Weight`] shares its layout, length and block count.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn dots_weight(
    w: &Weight,
    first: &Row,
    start: usize,
    dst: &mut [f32],
    x: &[f32],
    fp16: bool,
) -> bool {
    let Some(k) = Kernels::of(first, fp16) else {
        return dots(first, |i| w.row(i), start, dst, x, fp16);
    };
    if dst.is_empty() {
        return true;
    }
    // the last row exists, so every row before it does (its codes and its group's
    // parameters lie before the last row's)
    if w.row(start + dst.len() - 1).is_none() {
        return false;
    }
    let base = parts(&w.all);
    let (codes_per_row, nb) = match w.all {
        Row::Bytes { .. } => (w.k, w.blocks),
        Row::Nibbles { .. } => (w.k / 2, w.blocks),
    };
    let split_rows = k.s4.is_some();
    let row_parts = |i: usize| {
        let group = if w.rows_per == 1 { i } else { i / w.rows_per };
        let g = group * nb;
        // `i` and `g` lie inside the data (checked above); absent parts stay null
        let at = |ptr: *const u8, bytes: usize| match ptr.is_null() {
            true => ptr,
            false => ptr.wrapping_add(bytes),
        };
        let p = Parts {
            codes: at(base.codes, i * codes_per_row),
            scales: at(base.scales, 2 * g),
            offsets: at(base.offsets as *const u8, 4 * g) as *const f32,
            offsets16: at(base.offsets16 as *const u8, 2 * g) as *const u16,
            palettes: at(base.palettes as *const u8, 32 * g) as *const u16,
        };
        let level = match split_rows {
            true => w.split.get(group).copied().unwrap_or_default(),
            false => Split::No,
        };
        Some((p, level))
    };
    passes(&k, first.per(), row_parts, start, dst, x)
}

/// The passes of [`dots`] over rows given as their parts and split level: rows the split
/// kernels take are queued by their [`Split`] level, four of one level a pass (the rest one
/// at a time at the end): the split kernels for rows that split, the others for the rest.
///
/// # Safety
/// As [`dots`], for the rows `item` stands for.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn passes(
    k: &Kernels,
    per: usize,
    item: impl Fn(usize) -> Option<(Parts, Split)>,
    start: usize,
    dst: &mut [f32],
    x: &[f32],
) -> bool {
    let run4 = |level: Split, rows: &[Parts; 4]| match split::pick(level, k.s4) {
        Some(s) => s(rows, x, per),
        None => (k.k4)(rows, x, per),
    };
    let run1 = |level: Split, row: Parts| match split::pick(level, k.s1) {
        Some(s) => s(&[row], x, per)[0],
        None => (k.k1)(&[row], x, per)[0],
    };
    if k.s4.is_none() {
        let mut groups = dst.chunks_exact_mut(4);
        let mut i = start;
        for out in groups.by_ref() {
            let (Some((a, _)), Some((b, _)), Some((c, _)), Some((d, _))) =
                (item(i), item(i + 1), item(i + 2), item(i + 3))
            else {
                return false;
            };
            out.copy_from_slice(&(k.k4)(&[a, b, c, d], x, per));
            i += 4;
        }
        for d in groups.into_remainder() {
            let Some((row, _)) = item(i) else {
                return false;
            };
            *d = (k.k1)(&[row], x, per)[0];
            i += 1;
        }
        return true;
    }
    // four consecutive rows of one level a pass (the usual case); the rows of mixed passes
    // queued by level, four of one level a pass (a row's value never depends on its
    // pass-mates), the rest one at a time at the end
    let mut queues: [Vec<(usize, Parts)>; 3] = Default::default();
    let mut queue = |n: usize, row: Parts, level: Split, dst: &mut [f32]| {
        let q = &mut queues[level as usize];
        q.push((n, row));
        if let [(a, ra), (b, rb), (c, rc), (d, rd)] = q[..] {
            let v = run4(level, &[ra, rb, rc, rd]);
            (dst[a], dst[b], dst[c], dst[d]) = (v[0], v[1], v[2], v[3]);
            q.clear();
        }
    };
    let whole = dst.len() / 4 * 4;
    for n in (0..whole).step_by(4) {
        let i = start + n;
        let (Some(a), Some(b), Some(c), Some(d)) = (item(i), item(i + 1), item(i + 2), item(i + 3))
        else {
            return false;
        };
        let level = a.1;
        if [b.1, c.1, d.1].into_iter().all(|l| l == level) {
            dst[n..n + 4].copy_from_slice(&run4(level, &[a.0, b.0, c.0, d.0]));
        } else {
            for (m, (row, level)) in [a, b, c, d].into_iter().enumerate() {
                queue(n + m, row, level, dst);
            }
        }
    }
    for n in whole..dst.len() {
        let Some((row, level)) = item(start + n) else {
            return false;
        };
        queue(n, row, level, dst);
    }
    for (level, q) in [Split::No, Split::Rounds, Split::Exact]
        .into_iter()
        .zip(queues)
    {
        for (n, row) in q {
            dst[n] = run1(level, row);
        }
    }
    true
}
