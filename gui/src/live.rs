//! Live sources: anything that reports a heap's changes as it runs (a workload on a real device, another
//! process) plugs into the app through [`LiveSource`], one step at a time, and shows in a pane that grows as
//! the reports arrive. [`ChannelSource`] is the plain one: a sender on any thread, the app polling the
//! receiver every frame.

use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};

use heapscope_lab::timeline::{Change, Refusal};

/// One step of a live heap: its changes in order, and the request it refused, if any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveStep {
    /// The changes.
    pub changes: Vec<Change>,
    /// The request refused.
    pub refusal: Option<Refusal>,
}

/// A source of live heap steps.
pub trait LiveSource: std::fmt::Debug + Send {
    /// The steps reported since the last call (without blocking).
    fn poll(&mut self) -> Vec<LiveStep>;

    /// Whether the source has ended (it reports nothing more).
    fn finished(&self) -> bool;
}

/// A live source fed through a channel.
#[derive(Debug)]
pub struct ChannelSource {
    receiver: Receiver<LiveStep>,
    finished: bool,
}

impl ChannelSource {
    /// A source and the sender that feeds it; dropping every sender ends it.
    pub fn new() -> (Self, Sender<LiveStep>) {
        let (sender, receiver) = channel();
        (Self { receiver, finished: false }, sender)
    }
}

impl LiveSource for ChannelSource {
    fn poll(&mut self) -> Vec<LiveStep> {
        let mut steps = Vec::new();
        loop {
            match self.receiver.try_recv() {
                Ok(step) => steps.push(step),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.finished = true;
                    break;
                }
            }
        }
        steps
    }

    fn finished(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapscope_lab::timeline::RegionKind;

    #[test]
    fn steps_arrive_in_order_and_the_end_is_seen() {
        let (mut source, sender) = ChannelSource::new();
        assert!(source.poll().is_empty() && !source.finished());
        let step = |address| LiveStep {
            changes: vec![Change::RegionAdded { address, size_bytes: 10, kind: RegionKind::Block }],
            refusal: None,
        };
        sender.send(step(0)).unwrap();
        sender.send(step(100)).unwrap();
        assert_eq!(source.poll(), [step(0), step(100)]);
        drop(sender);
        assert!(source.poll().is_empty() && source.finished());
    }
}
