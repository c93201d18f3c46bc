//! The CNI verbs and `plexus explain`, side by side. Each is the same pipeline over stages:
//!
//! | verb | inputs ([`crate::inputs`]) | plan ([`crate::plan`]) | attach ([`crate::attach`]) | report ([`crate::report`]) |
//! |---|---|---|---|---|
//! | [`add`] | pod, NADs, devices | built, saved | ADD all, undo on failure | network-status, claims, event |
//! | [`del`] | only without a saved plan | the saved one (or rebuilt) | DEL all, reverse order | claims released |
//! | [`check`] (CHECK, STATUS, GC) | — | the saved ones | CHECK / DEL stale | — |
//! | [`explain`] | manifests on disk | built, printed | — | — |
//!
//! The inputs come from the API (thin mode), the daemon's caches (daemon mode) or files
//! (explain); nothing after the inputs stage knows which.

pub mod add;
pub mod check;
pub mod del;
pub mod explain;
