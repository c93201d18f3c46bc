//! From a [`MetaError`] to the CNI error result the caller prints: its code, msg and details.

use super::MetaError;
use plexus_conf::error::CniError;

impl MetaError {
    /// The CNI error result this error is reported as.
    pub fn to_cni(&self) -> CniError {
        let (msg, details) = self.describe();
        CniError::new(self.code(), msg, details)
    }
}

impl From<MetaError> for CniError {
    fn from(e: MetaError) -> CniError {
        e.to_cni()
    }
}
