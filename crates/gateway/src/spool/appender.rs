//! Appending receipts to the spool's segments: written in groups, mirrored in memory for the
//! shipper, held in memory (within a bound) while the disk refuses them.

use super::*;

/// The segment being appended to, the receipts last appended, and those the disk refused.
pub(super) struct Appender {
    pub(super) dir: PathBuf,
    pub(super) state: Mutex<Appending>,
    /// How many bytes of text the mirror keeps at most.
    pub(super) mirror_capacity: usize,
    pub(super) bound: MemoryBound,
    pub(super) stats: Arc<SpoolStats>,
}

pub(super) struct Appending {
    pub(super) segment: Segment,
    /// Receipts appended lately, in the order of their lines; at most `mirror_capacity` bytes of
    /// their text (`mirror_bytes`).
    pub(super) mirror: VecDeque<Mirrored>,
    pub(super) mirror_bytes: usize,
    /// Where delivery stands once it has passed every line of the segments before the one being
    /// appended to: the end of the segment last closed whole or, at start-up, the recorded progress
    /// when the files held nothing undelivered. From there, the next line is the first of the
    /// segment being appended to.
    pub(super) end_of_earlier: Option<Progress>,
    /// Receipts the disk refused, oldest first: appended once it takes them, or delivered from here.
    pub(super) held: VecDeque<SerializedReceipt>,
    pub(super) held_bytes: usize,
    /// The disk refused the last append: the next that succeeds says so in the log.
    pub(super) refusing: bool,
    /// Receipts lost, for a log line at most once a second.
    pub(super) drops: Throttled,
}

/// An appended receipt and the place of its line.
pub(super) struct Mirrored {
    pub(super) segment: u64,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) receipt: SerializedReceipt,
}

pub(super) struct Segment {
    pub(super) number: u64,
    pub(super) file: File,
    pub(super) size: u64,
    pub(super) dirty: bool,
    /// A failed append may have left part of a line that could not be cut away: the next append
    /// goes to a new segment.
    pub(super) torn: bool,
}

impl Segment {
    pub(super) fn create(dir: &Path, number: u64) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(segment_path(dir, number))?;
        let size = file.metadata()?.len();
        Ok(Self { number, file, size, dirty: false, torn: false })
    }
}

impl Appender {
    pub(super) fn open(
        dir: &Path,
        number: u64,
        mirror_capacity: usize,
        bound: MemoryBound,
        stats: Arc<SpoolStats>,
    ) -> io::Result<Self> {
        let segment = Segment::create(dir, number)?;
        let appending = Appending {
            segment,
            mirror: VecDeque::new(),
            mirror_bytes: 0,
            end_of_earlier: None,
            held: VecDeque::new(),
            held_bytes: 0,
            refusing: false,
            drops: Throttled::default(),
        };
        Ok(Self { dir: dir.to_owned(), state: Mutex::new(appending), mirror_capacity, bound, stats })
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Appending> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends the receipts' lines in one write, or holds the receipts in memory when the disk
    /// refuses them. Returns how many were kept: those lost are past memory's bound.
    pub(super) fn append(&self, mut receipts: Vec<SerializedReceipt>) -> usize {
        let mut state = self.lock();
        let count = receipts.len();
        let Err(e) = self.write(&mut state, &mut receipts) else { return count };
        if !state.refusing {
            state.refusing = true;
            tracing::warn!(
                error = %e,
                "the disk refused a receipt: receipts are held in memory and delivered from there \
                 until it takes them again"
            );
        }
        receipts.into_iter().map(|receipt| self.hold(&mut state, receipt)).filter(|&kept| kept).count()
    }

    /// Writes the receipts' lines, in one `writev` as a rule: lines never interleave, and a crash
    /// tears at most the last one. On failure the segment is cut back to its last whole line and
    /// the receipts stay in `receipts`; on success they are taken (into the mirror).
    pub(super) fn write(
        &self,
        state: &mut Appending,
        receipts: &mut Vec<SerializedReceipt>,
    ) -> io::Result<()> {
        let Appending { segment, mirror, mirror_bytes, end_of_earlier, held, refusing, .. } = state;
        if segment.size >= SEGMENT_BYTES || segment.torn {
            match Segment::create(&self.dir, segment.number + 1) {
                Ok(next) => {
                    // A torn segment may hold part of a line past its size: reading it tells.
                    *end_of_earlier =
                        (!segment.torn).then_some(Progress { segment: segment.number, offset: segment.size });
                    let full = std::mem::replace(segment, next);
                    // Forced to disk off the request path: appends never wait on an fsync.
                    std::thread::spawn(move || {
                        if let Err(e) = full.file.sync_data() {
                            tracing::error!(error = %e, "syncing a full receipt spool segment failed");
                        }
                    });
                }
                // A full segment takes more lines meanwhile; a torn one none.
                Err(e) if segment.torn => return Err(e),
                Err(_) => {}
            }
        }
        let writes = match write_lines(&mut segment.file, receipts) {
            Ok(writes) => writes,
            Err(e) => {
                // No part of a line stays: the next one would be read as its continuation.
                if segment.file.set_len(segment.size).is_err() {
                    segment.torn = true;
                }
                return Err(e);
            }
        };
        let appended_from = segment.size;
        for receipt in receipts.drain(..) {
            let start = segment.size;
            segment.size += receipt.json().len() as u64 + 1;
            if *mirror_bytes + receipt.json().len() <= self.mirror_capacity {
                *mirror_bytes += receipt.json().len();
                mirror.push_back(Mirrored { segment: segment.number, start, end: segment.size, receipt });
            }
        }
        segment.dirty = true;
        self.stats.bytes.fetch_add(segment.size - appended_from, Relaxed);
        self.stats.writes.fetch_add(writes, Relaxed);
        if *refusing && held.is_empty() {
            *refusing = false;
            tracing::info!("the disk takes receipts again; none is held in memory");
        }
        Ok(())
    }

    /// Keeps a receipt the disk refused, unless memory holds as many as its bound allows.
    pub(super) fn hold(&self, state: &mut Appending, receipt: SerializedReceipt) -> bool {
        let length = receipt.json().len();
        if state.held.len() >= self.bound.receipts || state.held_bytes + length > self.bound.bytes {
            self.stats.dropped.fetch_add(1, Relaxed);
            if let Some(lost) = state.drops.note() {
                tracing::error!(
                    lost,
                    held = state.held.len(),
                    held_bytes = state.held_bytes,
                    receipt_id = %receipt.into_receipt().id,
                    "the disk refuses receipts and memory holds as many as its bound allows: receipts lost"
                );
            }
            return false;
        }
        state.held_bytes += length;
        state.held.push_back(receipt);
        self.stats.held.fetch_add(1, Relaxed);
        true
    }

    /// Appends the receipts held in memory, oldest first, until the disk refuses them; a batch at a
    /// time, so that appends of requests wait at most one batch's write.
    pub(super) fn append_held(&self) {
        loop {
            let mut state = self.lock();
            if state.held.is_empty() {
                return;
            }
            let mut batch: Vec<_> = (0..BATCH).map_while(|_| state.held.pop_front()).collect();
            let (count, bytes) = (batch.len(), batch.iter().map(|r| r.json().len()).sum::<usize>());
            if self.write(&mut state, &mut batch).is_err() {
                for receipt in batch.into_iter().rev() {
                    state.held.push_front(receipt);
                }
                return;
            }
            state.held_bytes -= bytes;
            self.stats.held.fetch_sub(count as u64, Relaxed);
        }
    }

    /// Up to `most` receipts held in memory, for delivery from there.
    pub(super) fn take_held(&self, most: usize) -> Vec<SerializedReceipt> {
        let mut state = self.lock();
        let taken: Vec<_> = (0..most).map_while(|_| state.held.pop_front()).collect();
        let bytes: usize = taken.iter().map(|r| r.json().len()).sum();
        state.held_bytes -= bytes;
        self.stats.held.fetch_sub(taken.len() as u64, Relaxed);
        taken
    }

    /// Receipts taken by [`Self::take_held`] whose delivery failed, in front of those held since.
    pub(super) fn give_back_held(&self, receipts: Vec<SerializedReceipt>) {
        let mut state = self.lock();
        self.stats.held.fetch_add(receipts.len() as u64, Relaxed);
        for receipt in receipts.into_iter().rev() {
            state.held_bytes += receipt.json().len();
            state.held.push_front(receipt);
        }
    }

    /// Whether delivery standing at `at` has every appended line.
    pub(super) fn is_at_end(&self, at: Progress) -> bool {
        let state = self.lock();
        (state.segment.number, state.segment.size) == (at.segment, at.offset)
    }

    /// When delivery standing at `at` has every line of a segment that holds some, starts a new
    /// one, so that the delivered one can go: where delivery then stands.
    pub(super) fn roll_if_delivered(&self, at: Progress) -> Option<Progress> {
        let mut state = self.lock();
        let segment = &mut state.segment;
        if (segment.number, segment.size) != (at.segment, at.offset) || segment.size == 0 {
            return None;
        }
        let next = Segment::create(&self.dir, segment.number + 1).ok()?;
        *segment = next;
        let rolled = Progress { segment: segment.number, offset: 0 };
        state.end_of_earlier = Some(at);
        Some(rolled)
    }

    /// The batch that reading the files from `from` would give, when memory holds it: the lines
    /// that follow one another from `from`, either a whole batch or every line appended so far (so
    /// that a short batch still tells the shipper it reached the end). `None`: read the files.
    /// Receipts that delivery has already passed (read from the files meanwhile) are forgotten.
    pub(super) fn take_mirrored(&self, from: Progress) -> Option<Batch> {
        let mut state = self.lock();
        let Appending { segment, mirror, mirror_bytes, end_of_earlier, .. } = &mut *state;
        while let Some(passed) = mirror.pop_front_if(|m| (m.segment, m.end) <= (from.segment, from.offset)) {
            *mirror_bytes -= passed.receipt.json().len();
        }
        let (mut progress, mut run, mut bytes) = (from, 0, 0);
        for next in mirror.iter().take(BATCH) {
            if bytes >= BATCH_BYTES {
                break;
            }
            let start = Progress { segment: next.segment, offset: next.start };
            let crosses =
                (next.segment, next.start) == (segment.number, 0) && *end_of_earlier == Some(progress);
            if start != progress && !crosses {
                break;
            }
            progress = Progress { segment: next.segment, offset: next.end };
            run += 1;
            bytes += next.receipt.json().len();
        }
        let all_appended = (progress.segment, progress.offset) == (segment.number, segment.size);
        if run == 0 || (run < BATCH && bytes < BATCH_BYTES && !all_appended) {
            return None;
        }
        let receipts: Vec<_> = mirror.drain(..run).map(|m| m.receipt).collect();
        *mirror_bytes -= text_bytes(&receipts);
        Some(Batch { receipts, progress, corrupt: 0, held: 0, read_back: 0 })
    }

    /// Forces what was appended to disk, outside the lock so that appends never wait on it.
    pub(super) fn sync(&self) {
        let file = {
            let mut state = self.lock();
            let segment = &mut state.segment;
            if !segment.dirty {
                return;
            }
            segment.dirty = false;
            segment.file.try_clone()
        };
        if let Err(e) = file.and_then(|f| f.sync_data()) {
            tracing::error!(error = %e, "syncing the receipt spool failed");
        }
    }
}

/// The most lines one `writev` carries (two slices each, within Linux's `IOV_MAX` of 1024).
pub(super) const LINES_PER_WRITE: usize = 64;

/// Writes each receipt's text and a newline, in one `writev` per [`LINES_PER_WRITE`] lines unless
/// the kernel takes less (then the rest follows); how many `writev`s it made.
pub(super) fn write_lines(file: &mut File, receipts: &[SerializedReceipt]) -> io::Result<u64> {
    let mut writes = 0;
    for chunk in receipts.chunks(LINES_PER_WRITE) {
        let mut slices = [IoSlice::new(&[]); 2 * LINES_PER_WRITE];
        for (pair, receipt) in slices.chunks_exact_mut(2).zip(chunk) {
            pair[0] = IoSlice::new(receipt.json().as_bytes());
            pair[1] = IoSlice::new(b"\n");
        }
        let mut rest = &mut slices[..2 * chunk.len()];
        while !rest.is_empty() {
            writes += 1;
            match file.write_vectored(rest)? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                written => IoSlice::advance_slices(&mut rest, written),
            }
        }
    }
    Ok(writes)
}
