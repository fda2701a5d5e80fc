//! How the matvec kernels read a [`HalfWeight`]: the fused kernels' [`quant::Weight`] and
//! rows, and [`lut::matvec8`]'s 8-bit indices and palettes.

use anemone_mil::DType;

use super::{HalfWeight, OffsetValues, WeightData};
use crate::kernels::{lut, quant};

impl HalfWeight {
    /// The whole weight as the fused kernels read it ([`quant::Weight`]), in the layout of
    /// [`Self::fused_row`] (`Weight::row(i)` is `fused_row(i)`): rows found by arithmetic.
    pub(super) fn fused_weight(&self) -> Option<quant::Weight<'_>> {
        let k = self.shape[1];
        let (all, blocks) = match &self.data {
            WeightData::Half(_) => return None,
            WeightData::ShiftScale {
                data,
                scale,
                offset,
                offset_promotes,
                blocks,
                ..
            } => {
                let how = quant::ShiftScale {
                    signed: matches!(data.dtype(), DType::I8 | DType::I4),
                    scales: scale.bytes(),
                    offsets: offset.as_ref().map(OffsetValues::view),
                    round_shift: !offset_promotes,
                    split: quant::Split::No,
                };
                let per = blocks.cols_per;
                let all = match data.dtype() {
                    DType::I8 | DType::U8 => quant::Row::Bytes {
                        codes: data.bytes(),
                        how,
                        per,
                    },
                    DType::I4 | DType::U4 => quant::Row::Nibbles {
                        codes: data.bytes(),
                        tables: quant::Tables::ShiftScale(how),
                        per,
                    },
                    _ => return None,
                };
                (all, blocks)
            }
            WeightData::Lut {
                indices,
                table,
                palette,
                blocks,
            } => {
                if indices.dtype() != DType::U4 || *palette != 16 {
                    return None;
                }
                let all = quant::Row::Nibbles {
                    codes: indices.bytes(),
                    tables: quant::Tables::Palettes(table),
                    per: blocks.cols_per,
                };
                (all, blocks)
            }
        };
        if blocks.cols_per == 0 || k / blocks.cols_per != blocks.col_blocks {
            return None;
        }
        let split = match &self.data {
            WeightData::ShiftScale { split, .. } => &split[..],
            _ => &[],
        };
        Some(quant::Weight::new(all, k, blocks.rows_per)?.with_split(split))
    }

    /// The weight as [`lut::matvec8`] reads it: 8-bit palette indices, palettes of whole rows.
    pub(super) fn lut8(&self) -> Option<lut::Lut8<'_>> {
        match &self.data {
            WeightData::Lut {
                indices,
                table,
                blocks,
                ..
            } if indices.dtype().bits() == 8 && blocks.col_blocks == 1 => Some(lut::Lut8 {
                indices: indices.bytes(),
                table,
                rows_per_palette: blocks.rows_per,
            }),
            _ => None,
        }
    }

    /// Row `i` as the fused kernels read it, when the weight is one they take: 8-bit data or
    /// 4-bit data / palette indices, blocks of whole rows or of column runs.
    #[inline]
    pub(super) fn fused_row(&self, i: usize) -> Option<quant::Row<'_>> {
        let k = self.shape[1];
        let base = i * k;
        match &self.data {
            WeightData::Half(_) => None,
            WeightData::ShiftScale {
                data,
                scale,
                offset,
                offset_promotes,
                blocks,
                split,
            } => {
                let g = blocks.row(i);
                let nb = blocks.col_blocks;
                let how = quant::ShiftScale {
                    signed: matches!(data.dtype(), DType::I8 | DType::I4),
                    scales: scale.bytes().get(2 * g..2 * (g + nb))?,
                    offsets: match offset {
                        Some(o) => Some(o.view().get(g..g + nb)?),
                        None => None,
                    },
                    round_shift: !offset_promotes,
                    split: split.get(blocks.group(i)).copied().unwrap_or_default(),
                };
                let per = blocks.cols_per;
                match data.dtype() {
                    DType::I8 | DType::U8 => Some(quant::Row::Bytes {
                        codes: data.bytes().get(base..base + k)?,
                        how,
                        per,
                    }),
                    DType::I4 | DType::U4 if base.is_multiple_of(2) && k.is_multiple_of(2) => {
                        Some(quant::Row::Nibbles {
                            codes: data.bytes().get(base / 2..(base + k) / 2)?,
                            tables: quant::Tables::ShiftScale(how),
                            per,
                        })
                    }
                    _ => None,
                }
            }
            WeightData::Lut {
                indices,
                table,
                palette,
                blocks,
            } => {
                if indices.dtype() != DType::U4
                    || *palette != 16
                    || !base.is_multiple_of(2)
                    || !k.is_multiple_of(2)
                {
                    return None;
                }
                let g = blocks.row(i);
                Some(quant::Row::Nibbles {
                    codes: indices.bytes().get(base / 2..(base + k) / 2)?,
                    tables: quant::Tables::Palettes(
                        table.get(16 * g..16 * (g + blocks.col_blocks))?,
                    ),
                    per: blocks.cols_per,
                })
            }
        }
    }

    /// Whether the fused kernels take every row of this weight (its rows share one layout).
    pub(super) fn fused(&self) -> bool {
        self.shape[0] > 0 && self.fused_row(0).is_some_and(|r| quant::covers(&r))
    }
}
