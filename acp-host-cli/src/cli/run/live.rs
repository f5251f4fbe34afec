//! `--progress`: the live view of a run's children on stderr, drawn from the pure model
//! (`protocol::live::Tree`) fed by the run's events and by the permission questions put to the
//! person. A tree (indicatif's `MultiProgress`, redrawn in place) on a terminal, one plain line per
//! change of state otherwise, nothing under `--progress off`.
//!
//! Invariants: escape codes go only to a terminal (the mode is settled by
//! `protocol::live::Progress::shown`); the tree is redrawn by one thread of its own at most
//! [`TICKS_PER_SECOND`] times a second, never per event; while it is drawn and stdout is the
//! terminal too, the agent's text for stdout is written by that thread, whole lines only, with the
//! tree hidden meanwhile (a line not yet ended would be overwritten by the redraw), so the answer
//! streams above the tree (a line not ended shows once the run ends); a
//! question to the person hides the tree until it is answered (the child's plain line, awaiting
//! approval, stays above the question); at the end the tree is cleared and its final, collapsed
//! lines printed once.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use acp_host::permission::{DecisionFuture, PermissionHandler};
use acp_host::run::{Observer, ObserverError};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use protocol::events::Event;
use protocol::live::{Progress, Tree};
use protocol::permission::PermissionRequest;

use super::render::{Drawn, Renderer};

/// How often the tree is redrawn at most.
const TICKS_PER_SECOND: u8 = 10;
/// The most children the tree shows (the rest as `+N more`).
const MAX_SHOWN: usize = 12;
/// The most characters of a line (a longer one than the terminal is wide wraps; indicatif counts
/// the rows it takes).
const MAX_WIDTH: usize = 200;

/// The live view of one run.
pub(super) struct Live {
    started: Instant,
    state: Mutex<State>,
    wake: Condvar,
    /// The tree's drawing (`None` in plain mode).
    draw: Option<Draw>,
    ticker: Mutex<Option<JoinHandle<()>>>,
}

struct State {
    tree: Tree,
    /// Permission questions put to the person and not yet answered (the tree is hidden).
    asking: usize,
    /// The view's thread is to end.
    ending: bool,
    /// The tree is gone for good (the renderer writes stdout itself again).
    stopped: bool,
}

struct Draw {
    multi: MultiProgress,
    /// The tree, all its lines in its message.
    bar: ProgressBar,
    /// Whether the bar is in `multi` (drawn).
    shown: Mutex<bool>,
    renderer: Arc<Renderer>,
    /// Stdout is the terminal too: its text is written by the view's thread (whole lines).
    holds: bool,
}

impl Live {
    /// The view `progress` asks for (settled against stderr and `--verbose`), or `None` when
    /// nothing is shown. In tree mode, `renderer`'s stdout text is written by the view's thread.
    pub(super) fn start(
        progress: Progress,
        verbose: bool,
        renderer: &Arc<Renderer>,
    ) -> Option<Arc<Live>> {
        use std::io::IsTerminal as _;
        let shown = progress.shown(std::io::stderr().is_terminal(), verbose);
        let holds = std::io::stdout().is_terminal();
        let draw = match shown {
            Progress::Off => return None,
            Progress::Tree => Some(Draw {
                multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(
                    TICKS_PER_SECOND,
                )),
                bar: ProgressBar::hidden().with_style(
                    ProgressStyle::with_template("{msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                ),
                shown: Mutex::new(false),
                renderer: Arc::clone(renderer),
                holds,
            }),
            Progress::Auto | Progress::Plain => None,
        };
        let live = Arc::new(Live {
            started: Instant::now(),
            state: Mutex::new(State {
                tree: Tree::new(),
                asking: 0,
                ending: false,
                stopped: false,
            }),
            wake: Condvar::new(),
            draw,
            ticker: Mutex::default(),
        });
        if live.draw.is_some() {
            renderer.hold_for(Arc::clone(&live) as Arc<dyn Drawn>);
            let ticking = Arc::clone(&live);
            let handle = std::thread::Builder::new()
                .name("acp-host-progress".into())
                .spawn(move || ticking.tick_until_stopped())
                .ok();
            *live.ticker.lock().unwrap_or_else(PoisonError::into_inner) = handle;
        }
        Some(live)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the tree is up (what else is written on stderr hides it meanwhile).
    pub(super) fn drawing(&self) -> bool {
        self.draw.is_some() && !self.state().stopped
    }

    /// Whether the tree is up on the terminal stdout writes to (the renderer's stdout text then
    /// waits for the view's thread).
    pub(super) fn holds(&self) -> bool {
        self.draw.as_ref().is_some_and(|draw| draw.holds) && self.drawing()
    }

    /// Runs `write` with the tree hidden (text written to the terminal the tree is drawn on).
    pub(super) fn around(&self, write: impl FnOnce()) {
        match &self.draw {
            Some(draw) => draw.multi.suspend(write),
            None => write(),
        }
    }

    /// Plain mode: the lines of the changes (tree mode shows them at its next tick).
    fn changed(&self, lines: Vec<String>) {
        if self.draw.is_none() {
            for line in lines {
                note!("{line}");
            }
        }
    }

    fn tick_until_stopped(&self) {
        let period = Duration::from_millis(1000 / u64::from(TICKS_PER_SECOND));
        let mut shown: Vec<String> = Vec::new();
        let Some(draw) = &self.draw else { return };
        loop {
            {
                // A tick per period, whatever happens meanwhile; only the end wakes it early.
                let (state, _) = self
                    .wake
                    .wait_timeout_while(self.state(), period, |state| !state.ending)
                    .unwrap_or_else(PoisonError::into_inner);
                if state.ending {
                    return;
                }
            }
            // Not under the state's lock: the renderer holds its text's lock, then that one.
            if draw.holds {
                draw.renderer.write_held(self);
            }
            // Drawn under the state's lock, so a question hiding the tree is never drawn over.
            let state = self.state();
            if state.ending {
                return;
            }
            // Hidden while a question waits for the person, and until there is a child.
            let lines = if state.asking == 0 && !state.tree.is_empty() {
                state.tree.lines(self.now_ms(), MAX_WIDTH, MAX_SHOWN)
            } else {
                Vec::new()
            };
            // Every tick, so an attempt the draw target refused is made again at the next.
            if !(lines.is_empty() && shown.is_empty()) {
                draw.show(&lines);
            }
            shown = lines;
        }
    }

    /// The run is over: the tree is cleared, then the renderer writes stdout itself again (in
    /// that order: text written before the tree is wiped would be wiped with it).
    pub(super) fn stop(&self) {
        self.state().ending = true;
        self.wake.notify_all();
        let ticker = self
            .ticker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(ticker) = ticker {
            let _ = ticker.join();
        }
        if let Some(draw) = &self.draw {
            draw.show(&[]);
        }
        self.state().stopped = true;
    }

    /// Tree mode, after the run's last stdout write: the children as they ended, one line each.
    pub(super) fn summary(&self) {
        if self.draw.is_none() {
            return;
        }
        let lines = {
            let state = self.state();
            if state.tree.is_empty() {
                return;
            }
            state.tree.lines(self.now_ms(), MAX_WIDTH, MAX_SHOWN)
        };
        for line in lines {
            note!("{line}");
        }
    }

    /// A question for the person about to be asked: the child awaits approval, the tree hides.
    fn asking(&self, session: Option<&str>) {
        let mut state = self.state();
        state.asking += 1;
        let now = self.now_ms();
        let lines = state.tree.asking(session, now);
        // The tree is hidden until the answer (under the state's lock, so the view's thread
        // draws nothing meanwhile); the line stays above the question.
        if let Some(draw) = &self.draw {
            draw.show(&[]);
            for line in lines {
                note!("{line}");
            }
        } else {
            drop(state);
            self.changed(lines);
        }
    }

    fn answered(&self) {
        let mut state = self.state();
        state.asking = state.asking.saturating_sub(1);
    }
}

impl Draw {
    /// Shows `lines` (none: hides the tree). The tree is one bar of as many lines, so a tick is
    /// one draw attempt whatever the number of rows, and the draw target lets
    /// [`TICKS_PER_SECOND`] through a second.
    fn show(&self, lines: &[String]) {
        let mut shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.is_empty() {
            if *shown {
                // Wiped while the bar still holds what was drawn; its removal draws nothing.
                let _ = self.multi.clear();
                self.multi.remove(&self.bar);
                *shown = false;
            }
            return;
        }
        if !*shown {
            self.multi.add(self.bar.clone());
            *shown = true;
        }
        self.bar.set_message(lines.join("\n"));
    }
}

impl Observer for Live {
    fn on_event(&self, event: &Event) -> Result<(), ObserverError> {
        let lines = {
            let mut state = self.state();
            let now = self.now_ms();
            state.tree.apply(event, now)
        };
        self.changed(lines);
        Ok(())
    }
}

/// The run's observers: `renderer`, then the view when one is shown.
pub(super) fn observers(
    renderer: &Arc<Renderer>,
    live: Option<&Arc<Live>>,
) -> Vec<Arc<dyn Observer>> {
    let mut observers = vec![Arc::clone(renderer) as Arc<dyn Observer>];
    observers.extend(live.map(|live| Arc::clone(live) as Arc<dyn Observer>));
    observers
}

/// `asker`, watched by the view when one is shown.
pub(super) fn watched(
    asker: Arc<dyn PermissionHandler>,
    live: Option<&Arc<Live>>,
) -> Arc<dyn PermissionHandler> {
    match live {
        Some(live) => Arc::new(Watched {
            inner: asker,
            live: Arc::clone(live),
        }),
        None => asker,
    }
}

/// A line for stderr, with `live`'s tree hidden meanwhile while it is drawn.
pub(super) fn note(live: Option<&Live>, text: &str) {
    if let Some(live) = live.filter(|live| live.drawing()) {
        live.around(|| note!("{text}"));
    } else {
        note!("{text}");
    }
}

/// [`Live::stop`], when a view is shown.
pub(super) fn stop(live: Option<&Live>) {
    if let Some(live) = live {
        live.stop();
    }
}

/// [`Live::summary`], when a view is shown.
pub(super) fn summary(live: Option<&Live>) {
    if let Some(live) = live {
        live.summary();
    }
}

/// A permission handler whose questions the view knows of: the child awaits approval and the
/// tree is hidden while the person is asked.
struct Watched {
    inner: Arc<dyn PermissionHandler>,
    live: Arc<Live>,
}

impl PermissionHandler for Watched {
    fn decide(&self, request: PermissionRequest) -> DecisionFuture {
        self.live.asking(request.session_id.as_deref());
        let decided = self.inner.decide(request);
        let answered = Answered(Arc::clone(&self.live));
        Box::pin(async move {
            let decision = decided.await;
            drop(answered);
            decision
        })
    }
}

/// Ends a question's hold on the tree, answered or dropped (a cancelled turn).
struct Answered(Arc<Live>);

impl Drop for Answered {
    fn drop(&mut self) {
        self.0.answered();
    }
}

impl Drawn for Live {
    fn drawing(&self) -> bool {
        Live::drawing(self)
    }

    fn holds(&self) -> bool {
        Live::holds(self)
    }

    fn around(&self, write: &mut dyn FnMut()) {
        Live::around(self, write);
    }
}
