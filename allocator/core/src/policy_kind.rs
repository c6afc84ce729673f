//! [`PolicyKind`]: the catalogue of policies this crate implements — one name table (`tlsf`, `best-fit`, …), and
//! each policy built by kind. Apart from the `Policy` trait (`policy.rs`), which the policies implement: the
//! catalogue uses the policies, the policies use the trait, and no file is used by what it uses.

use std::fmt;
use std::str::FromStr;

use crate::policies::{BestFit, Buddy, FirstFit, Linear, LinearMode, Slab, Tlsf};
use crate::policy::rounded;
use crate::request::align_up;
use crate::{Policy, PolicyConfig, Request, Result};

/// Every policy of this crate, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum PolicyKind {
    /// Two-level segregated fit: O(1) allocate and free, immediate coalescing.
    Tlsf,
    /// The smallest free run that fits, lowest address on ties.
    BestFit,
    /// The lowest-addressed free run that fits.
    FirstFit,
    /// Power-of-two blocks split in halves and merged with their buddies.
    Buddy,
    /// A bump pointer in one of three modes.
    Linear(LinearMode),
    /// Fixed size classes in slab pages for small requests, TLSF for the rest.
    Slab,
}

impl PolicyKind {
    /// All policies, in the order reports list them.
    pub const ALL: [Self; 8] = [
        Self::Tlsf,
        Self::BestFit,
        Self::FirstFit,
        Self::Buddy,
        Self::Linear(LinearMode::Bump),
        Self::Linear(LinearMode::Stack),
        Self::Linear(LinearMode::Ring),
        Self::Slab,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tlsf => "tlsf",
            Self::BestFit => "best-fit",
            Self::FirstFit => "first-fit",
            Self::Buddy => "buddy",
            Self::Linear(mode) => mode.policy_name(),
            Self::Slab => "slab",
        }
    }

    /// Whether the policy keeps its free runs by address, so it can be told where to place
    /// ([`Policy::allocate_at`]) and its free space measured run by run: what compaction needs (`tlsf`, `best-fit`,
    /// `first-fit`).
    pub fn places_by_address(self) -> bool {
        matches!(self, Self::Tlsf | Self::BestFit | Self::FirstFit)
    }

    /// A policy of this kind over `[0, capacity_bytes)`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for invalid settings.
    pub fn build(self, capacity_bytes: u64, config: &PolicyConfig) -> Result<Box<dyn Policy>> {
        Ok(match self {
            Self::Tlsf => Box::new(Tlsf::with_config(capacity_bytes, config)?),
            Self::BestFit => Box::new(BestFit::with_config(capacity_bytes, config)?),
            Self::FirstFit => Box::new(FirstFit::with_config(capacity_bytes, config)?),
            Self::Buddy => Box::new(Buddy::with_config(capacity_bytes, config)?),
            Self::Linear(mode) => Box::new(Linear::with_config(capacity_bytes, mode, config)?),
            Self::Slab => Box::new(Slab::with_config(capacity_bytes, config)?),
        })
    }

    /// The smallest range a policy of this kind needs to serve `request` alone (a dedicated block):
    /// the request rounded up to `min_align_bytes`, or to a power of two for the buddy policy.
    pub fn dedicated_bytes(self, request: Request, config: &PolicyConfig) -> Option<u64> {
        let (size, align) = rounded(request, config.min_align_bytes)?;
        let size = align_up(size, config.granularity_bytes)?;
        match self {
            Self::Buddy => size.max(align).checked_next_power_of_two(),
            _ => Some(size),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = crate::UnknownName;

    fn from_str(text: &str) -> Result<Self, crate::UnknownName> {
        Self::ALL.into_iter().find(|kind| kind.name() == text).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|kind| kind.name()).collect();
            crate::UnknownName { what: "policy", name: text.to_owned(), expected: format!("one of {}", names.join(", ")) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.name().parse::<PolicyKind>(), Ok(kind));
            let policy = kind.build(1 << 20, &PolicyConfig::default()).unwrap();
            assert_eq!(policy.name(), kind.name());
            assert_eq!(policy.capacity_bytes(), 1 << 20);
        }
        assert!("nope".parse::<PolicyKind>().unwrap_err().to_string().contains("tlsf, best-fit"));
    }

    #[test]
    fn dedicated_bytes_table() {
        let config = PolicyConfig::default();
        let request = Request::new(150 << 20, 1).unwrap();
        assert_eq!(PolicyKind::Tlsf.dedicated_bytes(request, &config), Some(150 << 20));
        assert_eq!(PolicyKind::Buddy.dedicated_bytes(request, &config), Some(256 << 20));
        let odd = Request::new(1000, 1).unwrap();
        assert_eq!(PolicyKind::BestFit.dedicated_bytes(odd, &config), Some(1024));
        // Slab: a request whose class has no slot left, and no page to carve one, is placed by its TLSF at its own
        // size; so that is what it needs alone.
        assert_eq!(PolicyKind::Slab.dedicated_bytes(Request::new(33 << 10, 1).unwrap(), &config), Some(33 << 10));
    }
}
