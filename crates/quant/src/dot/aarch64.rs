//! NEON dot kernels (aarch64).

use super::RowFn;
use crate::GgmlType;

/// The NEON kernel for `ty`, if there is one. Callers must have checked
/// `Isa::Neon.is_available()`.
pub(super) fn neon_kernel(_ty: GgmlType) -> Option<RowFn> {
    None
}
