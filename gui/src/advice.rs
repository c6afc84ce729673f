//! The advice for the open recording ([`heapscope_lab::advise`]), computed on a worker thread so the window stays
//! live: every setting of the grid is a replay of the whole recording, and a large one takes a while. The panel
//! (`panels::advice`) shows its progress, then the ranked settings; a row opens as a pane beside the others.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use heapscope_lab::advise::{Advice, AdviseConfig, advise_until};
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
    /// Set when the run is dropped (another recording, device or capacity): the worker starts no more settings.
    cancelled: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

impl Drop for AdviceRun {
    /// A run dropped is given up ([`AdviceRun::give_up`]).
    fn drop(&mut self) {
        self.give_up();
    }
}

impl AdviceRun {
    /// Starts advising on `recording` (a copy: the session goes on) on a device of `capacity_bytes` (`None`: what
    /// the recording tells).
    pub fn start(recording: Recording, capacity_bytes: Option<u64>) -> Self {
        let name = recording.shown_name();
        let (done, total) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let result = Arc::new(Mutex::new(None));
        let cancelled = Arc::new(AtomicBool::new(false));
        let (worker_done, worker_total, worker_result) = (Arc::clone(&done), Arc::clone(&total), Arc::clone(&result));
        let worker_cancelled = Arc::clone(&cancelled);
        let worker = std::thread::Builder::new()
            .name("heapscope-advice".into())
            .spawn(move || {
                let config = AdviseConfig { capacity_bytes, ..AdviseConfig::default() };
                let progress = |done, total| {
                    worker_total.store(total, Ordering::Relaxed);
                    worker_done.store(done, Ordering::Relaxed);
                };
                let advice = match advise_until(&recording, &config, &progress, &worker_cancelled) {
                    Ok(Some(advice)) => Ok(advice),
                    Ok(None) => Err("the advice was given up".to_owned()),
                    Err(error) => Err(error.to_string()),
                };
                *worker_result.lock().unwrap_or_else(PoisonError::into_inner) = Some(advice);
            })
            .ok();
        if worker.is_none() {
            *result.lock().unwrap_or_else(PoisonError::into_inner) = Some(Err("cannot start the advice's worker".into()));
        }
        Self { name, done, total, result, cancelled, worker }
    }

    /// Where it stands.
    pub fn state(&self) -> AdviceState {
        match &*self.result.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(Ok(advice)) => AdviceState::Done(Box::new(advice.clone())),
            Some(Err(why)) => AdviceState::Failed(why.clone()),
            None => AdviceState::Running(self.done.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed)),
        }
    }

    /// Gives the advice up: its worker finishes the settings it is replaying and starts no others (a large
    /// recording's grid takes minutes, on the cores the next session's replays need); it then reads as failed.
    pub fn give_up(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Waits for the advice (tests).
    pub fn wait(&mut self) -> AdviceState {
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
        self.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Given up at once, the grid (27 settings of GPT-2's recording) stops after the settings already replaying,
    /// and says so; left alone, it ranks every setting.
    #[test]
    fn an_advice_given_up_stops() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/traces/pytorch/gpt2_train_fixed-default.pickle.gz");
        let recording = Recording::open(&path, 0).unwrap();
        let mut given_up = AdviceRun::start(recording.clone(), None);
        given_up.give_up();
        match given_up.wait() {
            AdviceState::Failed(why) => assert_eq!(why, "the advice was given up"),
            other => panic!("{other:?}"),
        }
        let (done, total) = (given_up.done.load(Ordering::Relaxed), given_up.total.load(Ordering::Relaxed));
        assert!(done < total || total == 0, "{done} of {total} settings replayed");
        let mut whole = AdviceRun::start(recording, None);
        assert!(matches!(whole.wait(), AdviceState::Done(advice) if advice.settings.len() > 20));
    }
}
