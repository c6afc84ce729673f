//! Playing a timeline: a position in steps (fractional while a step animates), play / pause / step /
//! speed, driven by a clock that tests replace.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Where time comes from. The app reads it once a frame; tests inject a [`ManualClock`].
pub trait Clock: std::fmt::Debug + Send {
    /// Seconds since some fixed moment.
    fn seconds(&self) -> f64;
}

/// The wall clock.
#[derive(Debug)]
pub struct SystemClock(Instant);

impl Default for SystemClock {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for SystemClock {
    fn seconds(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// A clock that moves only when told to; clones share the time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// Moves the time forward by `seconds`.
    pub fn advance(&self, seconds: f64) {
        let now = self.seconds() + seconds;
        self.0.store(now.to_bits(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn seconds(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::SeqCst))
    }
}

/// Speeds offered, in steps per second.
pub const SPEEDS: [f64; 8] = [1.0, 2.0, 5.0, 20.0, 100.0, 1_000.0, 10_000.0, 100_000.0];

/// A position on a timeline and how it moves.
#[derive(Clone, Debug, PartialEq)]
pub struct Playback {
    /// Steps played; the fraction is how far the next step's animation has gone.
    pub position: f64,
    /// Whether it moves by itself.
    pub playing: bool,
    /// Index into [`SPEEDS`].
    pub speed: usize,
    /// A step animation under way (from `step`/`back` or a seek by one), in steps per second.
    target: Option<f64>,
    /// Whether the user picked the speed (then a newly opened trace keeps it).
    speed_chosen: bool,
}

impl Default for Playback {
    fn default() -> Self {
        Self { position: 0.0, playing: false, speed: 1, target: None, speed_chosen: false }
    }
}

/// How long playing a whole trace takes at most at the speed a trace opens with (unless the user picked one), in
/// seconds: a 82-step story plays at 2 steps a second, a 12,000-step training trace at 1,000.
pub const WHOLE_TRACE_SECONDS: f64 = 60.0;

/// How long one step's animation takes when stepping by hand, in seconds.
pub const STEP_SECONDS: f64 = 0.4;

impl Playback {
    /// Steps per second at the current speed.
    pub fn steps_per_second(&self) -> f64 {
        SPEEDS[self.speed.min(SPEEDS.len() - 1)]
    }

    /// Whole steps whose changes are shown (the step animating counts).
    pub fn shown_steps(&self) -> u64 {
        self.position.ceil().max(0.0) as u64
    }

    /// How far the step being shown has played, 0 to 1 (1 when no step is animating).
    pub fn progress(&self) -> f32 {
        let fraction = self.position - self.position.floor();
        if fraction == 0.0 { 1.0 } else { fraction as f32 }
    }

    /// Advances by `seconds` of time in a timeline of `steps` steps; returns whether anything moved.
    pub fn tick(&mut self, seconds: f64, steps: u64) -> bool {
        let end = steps as f64;
        let before = self.position;
        if let Some(target) = self.target {
            let delta = seconds / STEP_SECONDS;
            self.position =
                if target > self.position { (self.position + delta).min(target) } else { (self.position - delta).max(target) };
            if self.position == target {
                self.target = None;
            }
        } else if self.playing {
            self.position = (self.position + seconds * self.steps_per_second()).min(end);
            if self.position >= end {
                self.playing = false;
            }
        }
        self.position = self.position.clamp(0.0, end);
        self.position != before
    }

    /// Plays or pauses; playing at the end starts over.
    pub fn toggle(&mut self, steps: u64) {
        self.target = None;
        self.playing = !self.playing;
        if self.playing && self.position >= steps as f64 {
            self.position = 0.0;
        }
    }

    /// Animates one step forward (from a whole step).
    pub fn step(&mut self, steps: u64) {
        self.playing = false;
        let from = self.target.unwrap_or(self.position).floor();
        self.position = from;
        self.target = Some((from + 1.0).min(steps as f64));
    }

    /// Goes one step back (at once: a step back shows the layout before it).
    pub fn back(&mut self) {
        self.playing = false;
        self.target = None;
        self.position = (self.position.ceil() - 1.0).max(0.0);
    }

    /// Jumps to `steps` steps, no animation.
    pub fn seek(&mut self, steps: u64) {
        self.target = None;
        self.position = steps as f64;
    }

    /// One speed faster (`faster`) or slower.
    pub fn change_speed(&mut self, faster: bool) {
        self.speed = if faster { (self.speed + 1).min(SPEEDS.len() - 1) } else { self.speed.saturating_sub(1) };
        self.speed_chosen = true;
    }

    /// A fresh playback for a timeline of `steps` steps: at the start, the speed the user picked if any, else the
    /// slowest (from 2 steps a second) that plays it all within [`WHOLE_TRACE_SECONDS`].
    pub fn for_steps(&self, steps: u64) -> Self {
        let speed = if self.speed_chosen {
            self.speed
        } else {
            (1..SPEEDS.len()).find(|&index| steps as f64 / SPEEDS[index] <= WHOLE_TRACE_SECONDS).unwrap_or(SPEEDS.len() - 1)
        };
        Self { speed, speed_chosen: self.speed_chosen, ..Self::default() }
    }

    /// Whether the next frames will move.
    pub fn moving(&self) -> bool {
        self.playing || self.target.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace opens at the slowest speed that plays it within a minute, from 2 steps a second; a speed the user
    /// picked stays.
    #[test]
    fn a_trace_opens_at_a_speed_that_fits_its_length() {
        let cases: [(u64, f64); 6] =
            [(0, 2.0), (82, 2.0), (121, 5.0), (1_200, 20.0), (12_355, 1_000.0), (100_000_000, 100_000.0)];
        for (steps, speed) in cases {
            assert_eq!(Playback::default().for_steps(steps).steps_per_second(), speed, "{steps} steps");
        }
        let mut picked = Playback::default();
        picked.change_speed(false);
        assert_eq!(picked.for_steps(12_355).steps_per_second(), 1.0, "the user's speed stays");
    }

    #[test]
    fn playing_moves_by_speed_and_stops_at_the_end() {
        let mut playback = Playback::default();
        playback.toggle(10);
        assert!(playback.tick(1.5, 10));
        assert_eq!((playback.position, playback.shown_steps()), (3.0, 3));
        playback.tick(0.25, 10);
        assert_eq!((playback.shown_steps(), playback.progress()), (4, 0.5));
        playback.tick(100.0, 10);
        assert_eq!((playback.position, playback.playing), (10.0, false));
        playback.toggle(10);
        assert_eq!(playback.position, 0.0, "play at the end starts over");
    }

    #[test]
    fn stepping_animates_one_step() {
        let mut playback = Playback::default();
        playback.seek(5);
        playback.step(10);
        playback.tick(STEP_SECONDS / 2.0, 10);
        assert_eq!((playback.shown_steps(), playback.progress()), (6, 0.5));
        assert!(playback.moving());
        playback.tick(STEP_SECONDS, 10);
        assert_eq!((playback.position, playback.progress(), playback.moving()), (6.0, 1.0, false));
        playback.back();
        assert_eq!(playback.position, 5.0);
        playback.seek(10);
        playback.step(10);
        playback.tick(1.0, 10);
        assert_eq!(playback.position, 10.0, "no step past the end");
    }

    #[test]
    fn speeds_and_clocks() {
        let mut playback = Playback::default();
        for _ in 0..20 {
            playback.change_speed(true);
        }
        assert_eq!(playback.steps_per_second(), 100_000.0);
        playback.change_speed(false);
        assert_eq!(playback.steps_per_second(), 10_000.0);
        let clock = ManualClock::default();
        let shared = clock.clone();
        shared.advance(1.25);
        assert_eq!(clock.seconds(), 1.25);
        assert!(SystemClock::default().seconds() >= 0.0);
    }
}
