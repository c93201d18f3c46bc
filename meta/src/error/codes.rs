//! The CNI error code of each [`MetaError`] variant: the table of docs/design.md ("Error
//! codes"); a wrapped `CniError` keeps its own code.

use super::MetaError;
use plexus_conf::error::code;

impl MetaError {
    /// The CNI error code, as docs/design.md's table lists it.
    pub fn code(&self) -> u32 {
        use MetaError::*;
        match self {
            Config { source }
            | CniArgs { source }
            | InterfaceName { source, .. }
            | StatusFailed { source, .. }
            | Annotation { source, .. }
            | NadInvalid { source, .. }
            | ConfigParse { source, .. }
            | NetworkConfig { source, .. }
            | PluginMissing { source, .. }
            | FixedIps { source, .. }
            | CheckpointInvalid { source, .. }
            | Delegate { source }
            | ResultCache { source }
            | Rollback { source, .. } => source.code,
            DevicesUnavailable { source, .. }
            | PlanInvalid { source, .. }
            | Attachment { source, .. }
            | RollbackFailed { source, .. } => source.code(),
            Combined(all) => all.first().map_or(code::INTERNAL, MetaError::code),
            KubeClient { source }
            | PodRead { source, .. }
            | NadRead { source, .. }
            | StatusWrite { source, .. }
            | ClaimRead { source, .. }
            | SliceList { source, .. } => source.cni_code(),
            NotReady { .. }
            | CheckpointUnreadable { .. }
            | ClaimMissing { .. }
            | ClaimNotAllocated { .. }
            | DaemonUnreachable { .. }
            | DaemonNoAnswer { .. }
            | AddressInUse { .. } => code::TRY_AGAIN_LATER,
            StatusNotReady { .. } | StatusPluginMissing { .. } => code::NOT_AVAILABLE,
            Isolation { .. }
            | NadNotFound { .. }
            | NetworkNotFound { .. }
            | NadEmpty { .. }
            | NoDefaultNetwork
            | ConfigFile { .. }
            | ConfigDirEmpty { .. }
            | NoDeviceLeft { .. }
            | CapabilityNotHonoured { .. }
            | DuplicateInterface { .. }
            | MetaPluginDelegate { .. }
            | NadPolicy { .. }
            | AddressInPool { .. }
            | MultipleDefaultRoutes { .. }
            | DraDeviceUnpublished { .. }
            | DraResourceMismatch { .. }
            | InterfaceExists { .. }
            | AlreadyAttached { .. } => code::INVALID_CONFIG,
            Manifest { .. }
            | CorruptPlan { .. }
            | PlanOfAnotherVersion { .. }
            | JsonFile { .. } => code::DECODE_FAILURE,
            NetnsOpen { .. } | NotAttached { .. } => code::UNKNOWN_CONTAINER,
            Lock { source, .. } if source.kind() == std::io::ErrorKind::TimedOut => {
                code::TRY_AGAIN_LATER
            }
            PlanRead { source, .. } if source.kind() == std::io::ErrorKind::InvalidData => {
                code::DECODE_FAILURE
            }
            Lock { .. }
            | PlanSave { .. }
            | PlanRead { .. }
            | PlanRemove { .. }
            | PlanNotRemoved { .. }
            | ResultsLeft { .. }
            | ReadFile { .. } => code::IO_FAILURE,
            NetnsEnter { .. }
            | Route { .. }
            | PlanEncode { .. }
            | Runtime { .. }
            | Internal { .. } => code::INTERNAL,
        }
    }
}
