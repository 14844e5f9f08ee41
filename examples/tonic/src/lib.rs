//! The code generated from `proto/quotes.proto` (see `build.rs`), for the `tonic_server`
//! example.

#![allow(missing_docs, unreachable_pub)]

/// The `quotes` package.
pub mod quotes {
    tonic::include_proto!("quotes");
}
