//! Where the spans of a gateway call go.

/// The target of the spans every gateway call makes on both sides (the
/// client's call, the gateway's request, auth, lookup, budget wait, provider
/// call). They are built for traces: a log at `info` or quieter leaves them
/// out, since building them for a log line that rarely comes cost the
/// gateway a sizeable share of its CPU per cached lookup (BENCHMARKS.md).
pub const CALL_SPANS: &str = "ccm_calls";
