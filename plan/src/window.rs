//! The planning window: which items are planned now and which jobs they wait on.
//!
//! A run of a million items must not hold a million planned items in memory. Items are
//! grouped in *lanes*, one per (benchmark, model under test); each lane has a cursor
//! over its items and at most `per_lane` *active* items (planned, not finished). The
//! coordinator takes candidates from the cursors ([`Window::next_candidate`]), skips those
//! the run state already holds as done, and activates the others; as active items finish,
//! their lanes take more. One window per lane rather than one for the run, so that a
//! slow model (a small API quota) does not hold back the lanes of fast ones, and every
//! pool gets work from the start.
//!
//! Nothing here is durable, and nothing needs to be: the run state holds results
//! and finished items, so after a restart the cursors start again at item 0, skip
//! finished items and re-plan every unfinished one.
//!
//! No IO: the planner evaluates items and asks for jobs to be published; this only
//! keeps the books.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use halyard_proto::JobId;

use crate::store::ItemKey;

#[derive(Clone, Debug)]
struct Lane {
    bench: u32,
    model: u32,
    items: u32,
    next: u32,
    active: usize,
}

/// The items waiting on one published job.
#[derive(Clone, Debug)]
pub struct Waiter {
    first: ItemKey,
    /// Further items sharing the job (rare; empty costs no allocation).
    more: Vec<ItemKey>,
    /// When this process published the job.
    pub published_at: Instant,
    /// The token of the job's pool ([`halyard_proto::subjects::pool_token`]): its result
    /// is taken from that pool's results subject only.
    pool: String,
}

impl Waiter {
    pub fn items(&self) -> impl Iterator<Item = ItemKey> + '_ {
        std::iter::once(self.first).chain(self.more.iter().copied())
    }
}

#[derive(Debug)]
pub struct Window {
    lanes: Vec<Lane>,
    /// Index of a benchmark's first lane.
    lane_of_bench: Vec<usize>,
    per_lane: usize,
    /// Round-robin position for [`Window::next_candidate`].
    turn: usize,
    active: HashSet<ItemKey>,
    waiters: HashMap<JobId, Waiter>,
}

impl Window {
    /// `shape[b]` is (models, items) of benchmark `b`.
    pub fn new(shape: &[(u32, u32)], per_lane: usize) -> Window {
        let mut lanes = Vec::new();
        let mut lane_of_bench = Vec::new();
        for (b, &(models, items)) in shape.iter().enumerate() {
            lane_of_bench.push(lanes.len());
            for m in 0..models {
                lanes.push(Lane { bench: b as u32, model: m, items, next: 0, active: 0 });
            }
        }
        Window {
            lanes,
            lane_of_bench,
            per_lane: per_lane.max(1),
            turn: 0,
            active: HashSet::new(),
            waiters: HashMap::new(),
        }
    }

    fn lane(&self, key: ItemKey) -> Option<usize> {
        let first = *self.lane_of_bench.get(key.bench as usize)?;
        let i = first + key.model as usize;
        (self.lanes.get(i)?.bench == key.bench).then_some(i)
    }

    /// The next item to consider, taken in turn from lanes with room; `None` when every
    /// lane is full or has no items left. The caller skips the item if it is already done
    /// or [`activate`](Window::activate)s it; either way the cursor has moved past it.
    pub fn next_candidate(&mut self) -> Option<ItemKey> {
        let n = self.lanes.len();
        for k in 0..n {
            let i = (self.turn + k) % n;
            let l = &mut self.lanes[i];
            if l.active < self.per_lane && l.next < l.items {
                let key = ItemKey { bench: l.bench, model: l.model, item: l.next };
                l.next += 1;
                self.turn = (i + 1) % n;
                return Some(key);
            }
        }
        None
    }

    /// `key` is planned and unfinished: it occupies a place in its lane.
    pub fn activate(&mut self, key: ItemKey) {
        if self.active.insert(key) {
            if let Some(i) = self.lane(key) {
                self.lanes[i].active += 1;
            }
        }
    }

    pub fn is_active(&self, key: ItemKey) -> bool {
        self.active.contains(&key)
    }

    /// `key` finished: its place goes to the next item of its lane.
    pub fn finish(&mut self, key: ItemKey) {
        if self.active.remove(&key) {
            if let Some(i) = self.lane(key) {
                self.lanes[i].active -= 1;
            }
        }
    }

    /// Active item `key` waits on job `id` of pool `pool`. True when no other item waits
    /// on it yet: the caller publishes it (once per job, whatever the number of items
    /// sharing it).
    pub fn wait_on(&mut self, key: ItemKey, id: JobId, pool: &str, now: Instant) -> bool {
        match self.waiters.get_mut(&id) {
            Some(w) => {
                if w.first != key && !w.more.contains(&key) {
                    w.more.push(key);
                }
                false
            }
            None => {
                let pool = halyard_proto::subjects::pool_token(pool);
                let w = Waiter { first: key, more: Vec::new(), published_at: now, pool };
                self.waiters.insert(id, w);
                true
            }
        }
    }

    /// Job `id` has a terminal result: the items that waited on it, if any.
    pub fn on_result(&mut self, id: &JobId) -> Option<Waiter> {
        self.waiters.remove(id)
    }

    /// Jobs published and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.waiters.len()
    }

    /// The pool token of job `id`, if an item waits on it.
    pub fn pool_of(&self, id: &JobId) -> Option<&str> {
        self.waiters.get(id).map(|w| w.pool.as_str())
    }

    pub fn is_waited_on(&self, id: &JobId) -> bool {
        self.waiters.contains_key(id)
    }

    /// Active items, in no particular order.
    pub fn active_items(&self) -> Vec<ItemKey> {
        self.active.iter().copied().collect()
    }

    pub fn active_count(&self) -> usize {
        self.active.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> JobId {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&n.to_be_bytes());
        JobId(b)
    }

    /// Each lane holds at most `per_lane` active items; finishing one lets exactly one more in,
    /// and every item is offered exactly once.
    #[test]
    fn lanes_are_bounded_and_every_item_offered_once() {
        let mut w = Window::new(&[(2, 10), (1, 3)], 2);
        let mut offered = Vec::new();
        while let Some(k) = w.next_candidate() {
            w.activate(k);
            offered.push(k);
        }
        assert_eq!(offered.len(), 6, "three lanes of two: {offered:?}");
        assert_eq!(w.active_count(), 6);
        // Lanes take turns, so every pool gets work from the start.
        assert_eq!((offered[0].bench, offered[0].model), (0, 0));
        assert_eq!((offered[1].bench, offered[1].model), (0, 1));
        assert_eq!((offered[2].bench, offered[2].model), (1, 0));
        w.finish(offered[0]);
        let k = w.next_candidate().expect("room in lane (0, 0)");
        assert_eq!((k.bench, k.model, k.item), (0, 0, 2));
        w.activate(k);
        assert_eq!(w.next_candidate(), None);
        // Drain everything: each item is offered once in all.
        let mut all: HashSet<ItemKey> = offered.into_iter().chain([k]).collect();
        loop {
            for a in w.active_items() {
                w.finish(a);
            }
            let mut any = false;
            while let Some(k) = w.next_candidate() {
                assert!(all.insert(k), "{k:?} offered twice");
                w.activate(k);
                any = true;
            }
            if !any {
                break;
            }
        }
        assert_eq!(all.len(), 23);
    }

    /// A skipped candidate (already done) takes no room; a lane runs dry on its own.
    #[test]
    fn skipped_candidates_take_no_room() {
        let mut w = Window::new(&[(1, 5)], 1);
        let a = w.next_candidate().unwrap();
        let b = w.next_candidate().unwrap();
        assert_eq!((a.item, b.item), (0, 1));
        w.activate(b);
        assert_eq!(w.next_candidate(), None);
        w.finish(b);
        assert_eq!(w.next_candidate().map(|k| k.item), Some(2));
    }

    /// A job shared by two items is published once and answers both.
    #[test]
    fn shared_job_published_once() {
        let mut w = Window::new(&[(1, 5)], 5);
        let now = Instant::now();
        let (a, b) = (w.next_candidate().unwrap(), w.next_candidate().unwrap());
        w.activate(a);
        w.activate(b);
        assert!(w.wait_on(a, id(1), "p", now));
        assert!(!w.wait_on(b, id(1), "p", now));
        assert!(!w.wait_on(a, id(1), "p", now));
        assert_eq!(w.outstanding(), 1);
        let waiter = w.on_result(&id(1)).unwrap();
        assert_eq!(waiter.items().collect::<Vec<_>>(), vec![a, b]);
        assert!(w.on_result(&id(1)).is_none(), "a duplicate result wakes nobody");
    }
}
