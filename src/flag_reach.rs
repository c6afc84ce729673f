//! Which contenders a flag changes, and the refusal of a flag given that changes none of those a command runs
//! (`replay`, `compare`, `summary` and `export` over their contenders, `render` over its panes): a flag passed over
//! would leave the user believing it was in force.

use anyhow::Result;
use heapscope_lab::contender::Contender;

/// The contenders a flag changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// The core policies' heaps of blocks (the heap rules).
    Heaps,
    /// The `paged` contender.
    Paged,
    /// Every contender but PyTorch's emulation, which keeps its own rules.
    NotPytorch,
    /// PyTorch's emulation, either setting.
    Pytorch,
}

impl Reach {
    /// What it changes, in words.
    fn words(self) -> &'static str {
        match self {
            Self::Heaps => "the core policies' heaps (tlsf, best-fit, ...)",
            Self::Paged => "the `paged` contender",
            Self::NotPytorch => "the contenders other than PyTorch's emulation",
            Self::Pytorch => "PyTorch's emulation (pytorch, pytorch-expandable)",
        }
    }

    /// Whether it changes one of `contenders`.
    fn changes_one_of(self, contenders: &[Contender]) -> bool {
        contenders.iter().any(|contender| match self {
            Self::Heaps => matches!(contender, Contender::Heap(_)),
            Self::Paged => *contender == Contender::Paged,
            Self::NotPytorch => !matches!(contender, Contender::Pytorch { .. }),
            Self::Pytorch => matches!(contender, Contender::Pytorch { .. }),
        })
    }
}

/// A flag as a command was given it: whether it was (away from its default), its name, and what it changes.
pub type Flag = (bool, &'static str, Reach);

/// The first of `flags` given that changes none of `contenders`, with what it changes, in words.
pub fn flag_reaching_none(flags: &[Flag], contenders: &[Contender]) -> Option<(&'static str, &'static str)> {
    flags
        .iter()
        .find(|&&(given, _, reach)| given && !reach.changes_one_of(contenders))
        .map(|&(_, flag, reach)| (flag, reach.words()))
}

/// Refuses the first of `flags` given that changes none of `contenders`; `runs` says what the command does with
/// them ("this run replays", "this image draws").
///
/// # Errors
/// That flag, what it applies to and the contenders run.
pub fn refuse_flags_reaching_none(flags: &[Flag], contenders: &[Contender], runs: &str) -> Result<()> {
    let Some((flag, reaches)) = flag_reaching_none(flags, contenders) else { return Ok(()) };
    let names: Vec<String> = contenders.iter().map(ToString::to_string).collect();
    anyhow::bail!("{flag} applies to {reaches} only, and {runs} {}: it would change nothing", names.join(", "))
}

#[cfg(test)]
mod tests {
    use heapscope_core::PolicyKind;
    use heapscope_lab::contender::{PYTORCH, PYTORCH_EXPANDABLE};

    use super::*;

    #[test]
    fn each_reach_changes_its_contenders_only() {
        let tlsf = Contender::Heap(PolicyKind::Tlsf);
        let cases: [(Reach, &[Contender], bool); 10] = [
            (Reach::Heaps, &[tlsf], true),
            (Reach::Heaps, &[PYTORCH, Contender::Paged, Contender::GpuAllocator, Contender::Vma], false),
            (Reach::Paged, &[Contender::Paged], true),
            (Reach::Paged, &[tlsf, PYTORCH_EXPANDABLE], false),
            (Reach::NotPytorch, &[Contender::Vma], true),
            (Reach::NotPytorch, &[PYTORCH, PYTORCH_EXPANDABLE], false),
            (Reach::Pytorch, &[PYTORCH_EXPANDABLE], true),
            (Reach::Pytorch, &[tlsf, Contender::Paged], false),
            (Reach::Heaps, &[], false),
            (Reach::Pytorch, &[tlsf, PYTORCH], true),
        ];
        for (reach, contenders, changes) in cases {
            assert_eq!(reach.changes_one_of(contenders), changes, "{reach:?} on {contenders:?}");
        }
    }

    #[test]
    fn the_first_flag_given_that_changes_nothing_is_refused_by_name() {
        let flags: [Flag; 3] =
            [(false, "--block-size", Reach::Heaps), (true, "--alloc-conf", Reach::Pytorch), (true, "--page-size", Reach::Paged)];
        assert_eq!(flag_reaching_none(&flags, &[PYTORCH]), Some(("--page-size", "the `paged` contender")));
        let error =
            refuse_flags_reaching_none(&flags, &[Contender::Paged, Contender::Heap(PolicyKind::Tlsf)], "this image draws")
                .unwrap_err();
        assert_eq!(
            error.to_string(),
            "--alloc-conf applies to PyTorch's emulation (pytorch, pytorch-expandable) only, and this image draws paged, tlsf: \
             it would change nothing"
        );
        assert!(refuse_flags_reaching_none(&flags, &[PYTORCH, Contender::Paged], "this run replays").is_ok());
    }
}
