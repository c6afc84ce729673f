//! [`Outcome`]: what became of a contender — it ran, with its figures, or it did not run, with why. The one shape of
//! every contender's result: a replay's [`Figures`](crate::compare::Figures) (`replay`, `compare`, `summary`, on a
//! simulated or a Vulkan device) and a bench run's report alike, so a table or a comparison shows a contender that
//! could not run as a row that says why, beside the others.

/// What became of a contender. See the module documentation.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome<F> {
    /// It ran: what it measured.
    Ran(F),
    /// It did not run where it was asked to (a device limit, a missing feature, a device-only contender without a
    /// device).
    NotRun {
        /// The contender, as reports name it (`paged (vulkan)`).
        name: String,
        /// Why, with what to do.
        why: String,
    },
}

impl<F> Outcome<F> {
    /// `name` did not run, because of `why`.
    pub fn not_run(name: impl Into<String>, why: impl Into<String>) -> Self {
        Self::NotRun { name: name.into(), why: why.into() }
    }

    /// Whether it ran.
    pub fn ran(&self) -> bool {
        matches!(self, Self::Ran(_))
    }

    /// Its figures, when it ran.
    pub fn figures(&self) -> Option<&F> {
        match self {
            Self::Ran(figures) => Some(figures),
            Self::NotRun { .. } => None,
        }
    }

    /// Why it did not run, when it did not.
    pub fn why_not_run(&self) -> Option<&str> {
        match self {
            Self::Ran(_) => None,
            Self::NotRun { why, .. } => Some(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ran_or_not_run_with_why() {
        let ran: Outcome<u32> = Outcome::Ran(7);
        let not_run: Outcome<u32> = Outcome::not_run("paged (vulkan)", "no sparse binding");
        // (outcome, ran, figures, why)
        let cases = [(&ran, true, Some(&7), None), (&not_run, false, None, Some("no sparse binding"))];
        for (outcome, ran, figures, why) in cases {
            assert_eq!((outcome.ran(), outcome.figures(), outcome.why_not_run()), (ran, figures, why), "{outcome:?}");
        }
    }
}
