//! The maps and sets heapscope keys by addresses, page numbers and ids (`u64`): rustc-hash's Fx hasher, where the
//! standard library's DoS-resistant SipHash costs more than the work around it (a 400,000-event trace does a
//! million map operations while it is read). Keys are program data: the worst a crafted trace can do is slow its
//! own replay down.

/// A hash map keyed by `u64`-like program data.
pub type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;
/// A hash set of `u64`-like program data.
pub type FastSet<K> = rustc_hash::FxHashSet<K>;
