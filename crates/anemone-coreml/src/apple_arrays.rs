//! `MLMultiArray`s to and from host tensors (read and written through their strides: Core ML
//! pads rows of fp16 outputs on the Neural Engine), and the activation buffers handed between
//! chunks: IOSurface-backed fp16 arrays (a `CVPixelBuffer` of `OneComponent16Half`, one row per
//! element of all dimensions but the last) that predictions write as output backings and the
//! next chunk reads as its input, without a trip through the host. Apple targets only.

use std::cell::RefCell;
use std::ptr::NonNull;

use anemone_backend::Tensor;
use anemone_mil::DType;
use block2::StackBlock;
use objc2::rc::Retained;
use objc2::AnyThread;
use objc2_core_foundation::{CFDictionary, CFRetained, CFString};
use objc2_core_ml::{MLMultiArray, MLMultiArrayDataType};
use objc2_core_video::{
    kCVPixelBufferIOSurfacePropertiesKey, kCVPixelFormatType_OneComponent16Half, kCVReturnSuccess,
    CVPixelBuffer, CVPixelBufferCreate,
};
use objc2_foundation::{NSArray, NSInteger, NSNumber};

use crate::CoreMlError;

/// Activations owned by the Core ML backend: an `MLMultiArray` over an IOSurface (fp16) or
/// plain memory (fp32), of one shape.
pub struct CoreMlBuffer {
    pub(crate) array: Retained<MLMultiArray>,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
}

// SAFETY: a buffer belongs to one session (`&mut` wherever it is written); the array's memory is
// only touched inside Core ML's scoped accessors or by a prediction under its package's lock.
unsafe impl Send for CoreMlBuffer {}

impl std::fmt::Debug for CoreMlBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CoreMlBuffer({} {:?})", self.dtype, self.shape)
    }
}

fn buffer_error(dtype: DType, shape: &[usize], message: impl Into<String>) -> CoreMlError {
    CoreMlError::Buffer {
        dtype: dtype.to_string(),
        shape: shape.to_vec(),
        message: message.into(),
    }
}

impl CoreMlBuffer {
    /// A zeroed buffer: fp16 over an IOSurface-backed pixel buffer (width = the last dimension,
    /// height = the product of the others), fp32 in plain memory.
    pub fn new(dtype: DType, shape: &[usize]) -> Result<Self, CoreMlError> {
        let array = match dtype {
            DType::F16 => iosurface_f16(shape)?,
            DType::F32 => {
                // SAFETY: a fresh array of a shape and a type Core ML supports.
                unsafe {
                    MLMultiArray::initWithShape_dataType_error(
                        MLMultiArray::alloc(),
                        &ns_shape(shape),
                        MLMultiArrayDataType::Float32,
                    )
                }
                .map_err(|e| buffer_error(dtype, shape, crate::apple::ns_error(&e)))?
            }
            other => {
                return Err(buffer_error(
                    other,
                    shape,
                    "activation buffers are fp16 or fp32",
                ))
            }
        };
        let mut buffer = CoreMlBuffer {
            array,
            dtype,
            shape: shape.to_vec(),
        };
        buffer.write(&Tensor::zeros(dtype, shape))?;
        Ok(buffer)
    }

    /// Writes `values` (of the buffer's dtype and shape) through the array's strides.
    pub fn write(&mut self, values: &Tensor) -> Result<(), CoreMlError> {
        if values.dtype != self.dtype || values.shape != self.shape {
            return Err(buffer_error(
                self.dtype,
                &self.shape,
                format!("cannot write {values} into it"),
            ));
        }
        write_array(&self.array, values);
        Ok(())
    }

    /// The values in row-major order, read through the array's strides.
    pub fn read(&self) -> Result<Tensor, CoreMlError> {
        let (dtype, shape, data) = read_multiarray(&self.array);
        Tensor::new(dtype, shape, data).map_err(|e| buffer_error(self.dtype, &self.shape, e.detail))
    }
    /// Copies position `position` of `from` (`[.., T]`) into this `[.., 1]` buffer of the same
    /// dtype, element bits as they are, each array read and written through its own strides
    /// (no host tensor in between).
    pub fn copy_position(
        &mut self,
        from: &CoreMlBuffer,
        position: usize,
    ) -> Result<(), CoreMlError> {
        let fits = match (from.shape.split_last(), self.shape.split_last()) {
            (Some((&t, rows)), Some((&1, to_rows))) => {
                rows == to_rows && position < t && from.dtype == self.dtype
            }
            _ => false,
        };
        if !fits || !matches!(self.dtype, DType::F16 | DType::F32) {
            return Err(buffer_error(
                self.dtype,
                &self.shape,
                format!(
                    "cannot take position {position} of a {} buffer of {:?}",
                    from.dtype, from.shape
                ),
            ));
        }
        let width = if self.dtype == DType::F16 { 2 } else { 4 };
        // SAFETY: reading the immutable description of a live array.
        let from_strides = unsafe { usizes(&from.array.strides()) };
        let rows: Vec<usize> = self.shape.clone();
        let read = StackBlock::new(|src: NonNull<std::ffi::c_void>, _size: NSInteger| {
            let write = StackBlock::new(
                |dst: NonNull<std::ffi::c_void>,
                 _size: NSInteger,
                 strides: NonNull<NSArray<NSNumber>>| {
                    // SAFETY: Core ML hands the strides for the duration of the block.
                    let to_strides = usizes(unsafe { strides.as_ref() });
                    for (i, o) in
                        crate::position_offsets(&rows, &from_strides, &to_strides, position)
                    {
                        // SAFETY: in-shape offsets through each array's own strides, inside the
                        // blocks that lend the bytes; the two arrays are distinct (`&mut self`).
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                (src.as_ptr() as *const u8).add(i * width),
                                (dst.as_ptr() as *mut u8).add(o * width),
                                width,
                            )
                        }
                    }
                },
            );
            // SAFETY: the block writes only within this array's shape, through its strides.
            unsafe { self.array.getMutableBytesWithHandler(&write) };
        });
        // SAFETY: the block only reads within `from`'s shape, through its strides.
        unsafe { from.array.getBytesWithHandler(&read) };
        Ok(())
    }
}

fn iosurface_f16(shape: &[usize]) -> Result<Retained<MLMultiArray>, CoreMlError> {
    let (width, height) = match shape.split_last() {
        Some((&last, rest)) if last > 0 => (last, rest.iter().product::<usize>().max(1)),
        _ => {
            return Err(buffer_error(
                DType::F16,
                shape,
                "an IOSurface buffer needs a non-empty last dimension",
            ))
        }
    };
    let surface_properties: CFRetained<CFDictionary<CFString, CFString>> = CFDictionary::empty();
    // SAFETY: Core Video's own constant key, valid for the life of the process.
    let key: &CFString = unsafe { kCVPixelBufferIOSurfacePropertiesKey };
    let attributes = CFDictionary::<CFString, CFDictionary<CFString, CFString>>::from_slices(
        &[key],
        &[&*surface_properties],
    );
    let mut raw: *mut CVPixelBuffer = std::ptr::null_mut();
    // SAFETY: a CFDictionary of pixel buffer attributes and a valid out pointer.
    let status = unsafe {
        CVPixelBufferCreate(
            None,
            width,
            height,
            kCVPixelFormatType_OneComponent16Half,
            Some(attributes.as_opaque()),
            NonNull::from(&mut raw),
        )
    };
    let pixel_buffer = match NonNull::new(raw) {
        // SAFETY: CVPixelBufferCreate returns a +1 reference we now own.
        Some(ptr) if status == kCVReturnSuccess => unsafe { CFRetained::from_raw(ptr) },
        _ => {
            return Err(buffer_error(
                DType::F16,
                shape,
                format!(
                    "CVPixelBufferCreate({width}x{height}, OneComponent16Half) returned {status}"
                ),
            ))
        }
    };
    // SAFETY: a pixel buffer whose width is the last dimension and whose height is the product
    // of the others, as the initializer requires; the array keeps the pixel buffer alive.
    Ok(unsafe {
        MLMultiArray::initWithPixelBuffer_shape(
            MLMultiArray::alloc(),
            &pixel_buffer,
            &ns_shape(shape),
        )
    })
}

/// Writes a tensor's values into an array of its shape, through the strides Core ML gives.
pub(crate) fn write_array(array: &MLMultiArray, values: &Tensor) {
    let block = StackBlock::new(
        |bytes: NonNull<std::ffi::c_void>,
         _size: NSInteger,
         strides: NonNull<NSArray<NSNumber>>| {
            // SAFETY: Core ML hands the buffer and its strides for the duration of the block.
            let strides = usizes(unsafe { strides.as_ref() });
            let base = bytes.as_ptr();
            for (flat, &v) in values.data.iter().enumerate() {
                let offset = crate::strided_offset(flat, &values.shape, &strides);
                // SAFETY: the offset of an in-shape index through the array's own strides.
                unsafe {
                    match values.dtype {
                        DType::F16 => {
                            *(base as *mut u16).add(offset) = half::f16::from_f32(v).to_bits()
                        }
                        DType::F32 => *(base as *mut f32).add(offset) = v,
                        _ => *(base as *mut i32).add(offset) = v as i32,
                    }
                }
            }
        },
    );
    // SAFETY: the block writes only within the array's shape, through its strides.
    unsafe { array.getMutableBytesWithHandler(&block) };
}

fn ml_dtype(d: DType) -> Option<MLMultiArrayDataType> {
    match d {
        DType::F16 => Some(MLMultiArrayDataType::Float16),
        DType::F32 => Some(MLMultiArrayDataType::Float32),
        DType::I32 => Some(MLMultiArrayDataType::Int32),
        _ => None,
    }
}

pub(crate) fn ns_shape(shape: &[usize]) -> Retained<NSArray<NSNumber>> {
    let numbers: Vec<Retained<NSNumber>> = shape.iter().map(|&d| NSNumber::new_usize(d)).collect();
    NSArray::from_retained_slice(&numbers)
}

pub(crate) fn usizes(a: &NSArray<NSNumber>) -> Vec<usize> {
    a.to_vec()
        .iter()
        .map(|n| n.integerValue().max(0) as usize)
        .collect()
}

/// A new `MLMultiArray` holding `t`'s values in `t`'s dtype.
pub(crate) fn to_multiarray(t: &Tensor) -> Result<Retained<MLMultiArray>, String> {
    let dtype = ml_dtype(t.dtype)
        .ok_or_else(|| format!("dtype {:?} has no Core ML array type", t.dtype))?;
    // SAFETY: a fresh array of the declared shape and type, written before anyone else sees it.
    let array = unsafe {
        MLMultiArray::initWithShape_dataType_error(
            MLMultiArray::alloc(),
            &ns_shape(&t.shape),
            dtype,
        )
    }
    .map_err(|e| crate::apple::ns_error(&e))?;
    write_array(&array, t);
    Ok(array)
}

/// An `MLMultiArray`'s values in row-major order, read through its strides (Core ML pads the
/// last dimension of fp16 outputs on the Neural Engine; an IOSurface row is 64-byte aligned).
pub(crate) fn read_multiarray(a: &MLMultiArray) -> (DType, Vec<usize>, Vec<f32>) {
    // SAFETY: reading the immutable description of a finished array.
    let (shape, strides, dtype) =
        unsafe { (usizes(&a.shape()), usizes(&a.strides()), a.dataType()) };
    let d = if dtype == MLMultiArrayDataType::Float16 {
        DType::F16
    } else if dtype == MLMultiArrayDataType::Int32 {
        DType::I32
    } else {
        DType::F32
    };
    let n: usize = shape.iter().product();
    let out = RefCell::new(Vec::with_capacity(n));
    let block = StackBlock::new(|bytes: NonNull<std::ffi::c_void>, _size: NSInteger| {
        let base = bytes.as_ptr();
        let mut out = out.borrow_mut();
        for flat in 0..n {
            let o = crate::strided_offset(flat, &shape, &strides);
            // SAFETY: the offset of an in-shape index through the array's own strides, inside
            // the block that lends the bytes.
            out.push(unsafe {
                match d {
                    DType::F16 => half::f16::from_bits(*(base as *const u16).add(o)).to_f32(),
                    DType::I32 => *(base as *const i32).add(o) as f32,
                    _ if dtype == MLMultiArrayDataType::Float64 => {
                        *(base as *const f64).add(o) as f32
                    }
                    _ => *(base as *const f32).add(o),
                }
            });
        }
    });
    // SAFETY: the block only reads within the array's shape, through its strides.
    unsafe { a.getBytesWithHandler(&block) };
    (d, shape, out.into_inner())
}
