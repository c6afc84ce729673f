//! The advice for the open recording ([`heapscope_lab::advise`]), computed on a worker thread so the window stays
//! live: every setting of the grid is a replay of the whole recording, and a large one takes a while. The panel
//! (`panels::advice`) shows its progress, then the ranked settings; a row opens as a pane beside the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use heapscope_lab::advise::{Advice, AdviseConfig, advise};
use heapscope_lab::recording::Recording;

/// What the worker has so far.
#[derive(Debug)]
pub enum AdviceState {
    /// Settings replayed, of how many (0 of 0 before the first).
    Running(usize, usize),
    /// The ranked settings.
    Done(Box<Advice>),
    /// Why there is no advice.
    Failed(String),
}

/// One advice being computed, or computed. See the module documentation.
#[derive(Debug)]
pub struct AdviceRun {
    /// The recording's name, to tell whether the run is about the session shown.
    pub name: String,
    done: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
    result: Arc<Mutex<Option<Result<Advice, String>>>>,
    worker: Option<JoinHandle<()>>,
}

impl AdviceRun {
    /// Starts advising on `recording` (a copy: the session goes on) on a device of `capacity_bytes` (`None`: what
    /// the recording tells).
    pub fn start(recording: Recording, capacity_bytes: Option<u64>) -> Self {
        let name = recording.shown_name();
        let (done, total) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let result = Arc::new(Mutex::new(None));
        let (worker_done, worker_total, worker_result) = (Arc::clone(&done), Arc::clone(&total), Arc::clone(&result));
        let worker = std::thread::Builder::new()
            .name("heapscope-advice".into())
            .spawn(move || {
                let config = AdviseConfig { capacity_bytes, ..AdviseConfig::default() };
                let advice = advise(&recording, &config, &|done, total| {
                    worker_total.store(total, Ordering::Relaxed);
                    worker_done.store(done, Ordering::Relaxed);
                })
                .map_err(|error| error.to_string());
                *worker_result.lock().unwrap_or_else(PoisonError::into_inner) = Some(advice);
            })
            .ok();
        if worker.is_none() {
            *result.lock().unwrap_or_else(PoisonError::into_inner) = Some(Err("cannot start the advice's worker".into()));
        }
        Self { name, done, total, result, worker }
    }

    /// Where it stands.
    pub fn state(&self) -> AdviceState {
        match &*self.result.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(Ok(advice)) => AdviceState::Done(Box::new(advice.clone())),
            Some(Err(why)) => AdviceState::Failed(why.clone()),
            None => AdviceState::Running(self.done.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed)),
        }
    }

    /// Waits for the advice (tests).
    pub fn wait(&mut self) -> AdviceState {
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
        self.state()
    }
}
