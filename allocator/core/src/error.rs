//! The one error type of the core, for what a caller cannot rule out in advance.
//!
//! "Doesn't fit" is not an error: [`Policy::allocate`](crate::Policy::allocate) returns `None`. Errors are
//! misuse that must not become undefined behaviour (a bad request, a double free, a foreign handle), running
//! out of memory in the [`Heap`](crate::Heap) (with its [`OomVerdict`]), a failing
//! [`MemorySource`](crate::MemorySource), and malformed input files.

use crate::oom::OomVerdict;

/// What went wrong.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A request of zero bytes.
    #[error("invalid request: size_bytes is 0 (a request must ask for at least one byte)")]
    ZeroSize,
    /// An alignment that is not a power of two.
    #[error("invalid request: align_bytes = {align_bytes} is not a power of two")]
    AlignmentNotPowerOfTwo {
        /// The alignment asked for.
        align_bytes: u64,
    },
    /// A size that overflows `u64` once rounded up to its alignment.
    #[error("invalid request: size_bytes = {size_bytes} overflows u64 when rounded up to align_bytes = {align_bytes}")]
    SizeOverflow {
        /// The size asked for.
        size_bytes: u64,
        /// The alignment asked for.
        align_bytes: u64,
    },
    /// A granularity, minimum alignment or block size that is not a power of two, or out of range.
    #[error("invalid configuration: {what}")]
    InvalidConfig {
        /// What is wrong, in words.
        what: String,
    },
    /// The allocation was already freed (or its handle is stale).
    #[error("double free: the allocation at offset {offset} (id {id}) is not live in this {owner}")]
    DoubleFree {
        /// Offset of the allocation in its range.
        offset: u64,
        /// Its id.
        id: u64,
        /// Name of the policy or heap that was asked to free it.
        owner: &'static str,
    },
    /// The allocation belongs to another policy or heap instance.
    #[error("foreign allocation: the allocation at offset {offset} was made by another allocator instance, not this {owner}")]
    ForeignAllocation {
        /// Offset of the allocation in its range.
        offset: u64,
        /// Name of the policy or heap that was asked to free it.
        owner: &'static str,
    },
    /// The heap could not serve a request: why, in numbers.
    #[error("out of memory: {0}")]
    OutOfMemory(Box<OomVerdict>),
    /// The memory source failed for a reason other than running out of memory.
    #[error("memory source failed: {0}")]
    Source(String),
    /// The device cannot do what the memory source was asked at all, whatever memory it has (more live sparse
    /// mappings than a CPU device holds, a block past its largest allocation): the allocator cannot run on it, where
    /// others may.
    #[error("past a limit of the device: {0}")]
    DeviceLimit(String),
    /// A trace file could not be read: `file:line: what`, or `file: what` when no line applies (binary traces,
    /// replays).
    #[error("{file}{}: {what}", line_suffix(*.line))]
    Trace {
        /// The file (or `<memory>`).
        file: String,
        /// 1-based line number; 0 when no line applies.
        line: u64,
        /// What is wrong with it.
        what: String,
    },
}

/// `:line`, or nothing for line 0 (no line applies).
fn line_suffix(line: u64) -> String {
    if line == 0 { String::new() } else { format!(":{line}") }
}

/// `Result` with the core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_errors_name_the_line_only_when_known() {
        let cases = [(7, "bad.csv:7: unknown event \"x\""), (0, "bad.csv: unknown event \"x\"")];
        for (line, shown) in cases {
            let error = Error::Trace { file: "bad.csv".into(), line, what: "unknown event \"x\"".into() };
            assert_eq!(error.to_string(), shown);
        }
    }
}

/// A name that is none of a table's (a policy, a release or unmap rule, a workload setting), with the names there
/// are: what every `FromStr` of a named choice returns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?}: expected {expected}")]
pub struct UnknownName {
    /// What was being named ("policy", "release rule", ...).
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// The names there are, in words.
    pub expected: String,
}
