//! The ZooKeeper backend of fencelock: **not implemented yet** (issue 4).
//!
//! It will use Curator-compatible ephemeral sequential nodes with the node's czxid as the
//! fencing token. Until then this crate is an empty workspace member.
#![forbid(unsafe_code)]
