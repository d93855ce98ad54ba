//! The etcd backend of fencelock.
#![forbid(unsafe_code)]
