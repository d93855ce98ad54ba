//! Test support: real servers on free loopback ports.
#![forbid(unsafe_code)]
