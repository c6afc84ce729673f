//! Which stack frames say where memory was allocated, and which are the allocator's or the interpreter's own.
//!
//! A snapshot recorded with `_record_memory_history(stacks="all")` carries, for every allocation, the whole
//! stack: the unwinder and the traceback gatherer, CPython's evaluation loop, PyTorch's dispatcher, then the
//! model's Python code. Shown as they are, a hover or a table fills with the first and never reaches the last
//! ("... 69 more"). heapscope folds them the way PyTorch's memory_viz does: a frame is *noise* when its function
//! or file names the machinery ([`is_noise`]: the unwinder, the gatherer, the C start-up, CPython's call and eval
//! functions, the dispatcher's boxing and registration files), and also the caching allocator's own frames, which
//! memory_viz keeps; [`folded`] keeps the rest, innermost first. A stack made only of the machinery (an allocation
//! from a C++ thread, or frames the noise lists name too widely) is kept whole instead: folded away, it would read
//! as no stack recorded at all.
//! [`user_frame`] picks the one frame to attribute memory to: the innermost kept frame of Python code outside
//! PyTorch's own package (the model's line), else the innermost kept Python frame, else the innermost kept frame.

use crate::snapshot::Frame;

/// Function names (substrings) of the unwinder, the traceback gatherer, the C start-up, CPython's call machinery
/// (memory_viz's list) and the caching allocator itself (its `malloc`, where every stack begins: memory_viz keeps it,
/// heapscope folds it as the machinery it is).
const NOISE_FUNCTIONS: [&str; 11] = [
    "unwind::unwind",
    "CUDACachingAllocator::",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
    "PyVectorcall_",
    "_PyEval",
    "_PyObject",
];

/// File names (substrings) of the dispatcher's plumbing and CPython's interpreter sources.
const NOISE_FILES: [&str; 11] = [
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
    "Python/generated_cases.c.h",
];

/// Whether `frame` is the allocator's, the unwinder's or the interpreter's own (see the module docs).
pub fn is_noise(frame: &Frame) -> bool {
    &*frame.name == "_start"
        || NOISE_FUNCTIONS.iter().any(|noise| frame.name.contains(noise))
        || NOISE_FILES.iter().any(|noise| frame.filename.contains(noise))
}

/// The frames of `frames` (innermost first) that are not noise, in order; all of them when every one is.
pub fn folded(frames: &[Frame]) -> impl Iterator<Item = &Frame> {
    let all_noise = frames.iter().all(is_noise);
    frames.iter().filter(move |frame| all_noise || !is_noise(frame))
}

/// The names Python gives code that is no file: `<stdin>`, `<string>` (`python -c`, `exec`), the interactive
/// `<console>` and `<input>`, IPython's cells (`<ipython-input-3-5f1c2d>`) and torch.fx's generated forward
/// (`<eval_with_key>.5`). Not the standard library's `<frozen runpy>` (the interpreter's), nor another name in angle
/// brackets, which a native frame may carry.
const PYTHON_PSEUDO_FILES: [&str; 6] = ["<stdin>", "<string>", "<console>", "<input>", "<ipython-input-", "<eval_with_key>"];

/// Whether `frame` is Python source: a `.py` or `.pyw` file, or code Python names without a file
/// ([`PYTHON_PSEUDO_FILES`]).
fn is_python(frame: &Frame) -> bool {
    let file = &*frame.filename;
    file.ends_with(".py") || file.ends_with(".pyw") || PYTHON_PSEUDO_FILES.iter().any(|name| file.starts_with(name))
}

/// Whether `frame` is PyTorch's own Python (its package's files: `torch/nn/modules/linear.py`, ...), with either
/// separator (`C:\...\site-packages\torch\nn\modules\linear.py` on Windows).
fn is_torch(frame: &Frame) -> bool {
    let file = &*frame.filename;
    file.contains("/torch/") || file.starts_with("torch/") || file.contains("\\torch\\") || file.starts_with("torch\\")
}

/// The frame to attribute an allocation to (see the module docs); `None` for no frame at all.
pub fn user_frame(frames: &[Frame]) -> Option<&Frame> {
    folded(frames)
        .find(|frame| is_python(frame) && !is_torch(frame))
        .or_else(|| folded(frames).find(|frame| is_python(frame)))
        .or_else(|| folded(frames).next())
}

/// `function (file:line)`, the line `?` where Python knew none.
pub fn describe(frame: &Frame) -> String {
    if frame.line < 0 {
        format!("{} ({}:?)", frame.name, frame.filename)
    } else {
        format!("{} ({}:{})", frame.name, frame.filename, frame.line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, filename: &str, line: i64) -> Frame {
        Frame { filename: filename.into(), line, name: name.into() }
    }

    /// A stack as `stacks="all"` records it, innermost first.
    fn all_stack() -> Vec<Frame> {
        vec![
            frame("torch::unwind::unwind()", "??", 0),
            frame("torch::CapturedTraceback::gather(bool, bool, bool)", "??", 0),
            frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", "??", 0),
            frame("at::native::empty_cuda", "aten/src/ATen/native/cuda/EmptyTensor.cpp", 40),
            frame("c10::impl::BoxedKernelWrapper", "aten/src/ATen/core/boxing/impl/WrapFunctionIntoFunctor.h", 13),
            frame("_PyEval_EvalFrameDefault", "Python/ceval.c", 4704),
            frame("forward", "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125),
            frame("PyObject_Call", "Objects/call.c", 367),
            frame("forward", "/home/me/model.py", 42),
            frame("train_step", "/home/me/train.py", 17),
            frame("__libc_start_main", "??", 0),
        ]
    }

    #[test]
    fn noise_is_folded_and_the_models_line_is_the_user_frame() {
        let stack = all_stack();
        let kept: Vec<&str> = folded(&stack).map(|f| &*f.filename).collect();
        assert_eq!(
            kept,
            [
                "aten/src/ATen/native/cuda/EmptyTensor.cpp",
                "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
                "/home/me/model.py",
                "/home/me/train.py"
            ]
        );
        assert_eq!(user_frame(&stack).map(describe).as_deref(), Some("forward (/home/me/model.py:42)"));
    }

    #[test]
    fn user_frame_falls_back_in_order() {
        // (stack, expected user frame): PyTorch's Python when there is no other, any kept frame when there is no
        // Python, the innermost frame when every frame is noise, nothing when there is no frame.
        let torch_only = vec![frame("PyObject_Call", "Objects/call.c", 1), frame("forward", "torch/nn/modules/linear.py", 125)];
        let native_only = vec![frame("torch::unwind::unwind()", "??", 0), frame("at::empty", "EmptyTensor.cpp", 3)];
        let noise_only = vec![frame("torch::unwind::unwind()", "??", 0), frame("__libc_start_main", "??", 0)];
        let cases: [(&[Frame], Option<&str>); 4] = [
            (&torch_only, Some("forward (torch/nn/modules/linear.py:125)")),
            (&native_only, Some("at::empty (EmptyTensor.cpp:3)")),
            (&noise_only, Some("torch::unwind::unwind() (??:0)")),
            (&[], None),
        ];
        for (stack, expected) in cases {
            assert_eq!(user_frame(stack).map(describe).as_deref(), expected, "{stack:?}");
        }
        // Only the machinery: kept whole, not read as no stack.
        assert_eq!(folded(&noise_only).count(), noise_only.len());
    }

    #[test]
    fn the_user_frame_is_python_outside_torch_wherever_it_runs_table() {
        // (the caller's file under PyTorch's `linear.py`, PyTorch's own path, the user frame's file)
        let cases = [
            ("/home/me/model.py", "/site-packages/torch/nn/modules/linear.py", "/home/me/model.py"),
            ("train.pyw", "/site-packages/torch/nn/modules/linear.py", "train.pyw"),
            ("<stdin>", "/site-packages/torch/nn/modules/linear.py", "<stdin>"),
            ("<string>", "/site-packages/torch/nn/modules/linear.py", "<string>"),
            ("<ipython-input-3-5f1c2d>", "/site-packages/torch/nn/modules/linear.py", "<ipython-input-3-5f1c2d>"),
            ("<eval_with_key>.5", "/site-packages/torch/nn/modules/linear.py", "<eval_with_key>.5"),
            (r"C:\work\model.py", r"C:\Python311\Lib\site-packages\torch\nn\modules\linear.py", r"C:\work\model.py"),
            // The interpreter's frozen modules, and a native frame's name in brackets, are no user code: PyTorch's Python
            // is taken before them.
            ("<frozen runpy>", "/site-packages/torch/nn/modules/linear.py", "/site-packages/torch/nn/modules/linear.py"),
            ("<unknown>", "/site-packages/torch/nn/modules/linear.py", "/site-packages/torch/nn/modules/linear.py"),
        ];
        for (caller, torch, expected) in cases {
            let stack =
                vec![frame("at::empty", "EmptyTensor.cpp", 3), frame("forward", torch, 125), frame("<module>", caller, 7)];
            assert_eq!(user_frame(&stack).map(|frame| &*frame.filename), Some(expected), "{caller} under {torch}");
        }
    }

    #[test]
    fn an_unknown_line_reads_as_a_question_mark() {
        assert_eq!(describe(&frame("<module>", "capture.py", -1)), "<module> (capture.py:?)");
    }
}
