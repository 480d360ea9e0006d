//! Whether an image of a volume (a snapshot's copy) is a crash-consistent cut of a verifying
//! writer's run: the volume as it was at one moment between two acknowledged writes. No I/O.
//!
//! Each block of the image holds one write of the writer, named by its stamp, or zeros. Per
//! block, the write it holds and every earlier write to it are *included*; the later writes
//! submitted to it are *excluded*. The image is a cut iff there is a moment P after every
//! included write was submitted and before every excluded write was acknowledged:
//!
//! ```text
//!     max(submitted over included) < min(acknowledged over excluded)
//! ```
//!
//! The times are the writer's: a write's submit time is taken before it is sent (the server
//! cannot have it earlier) and its ack time after its reply is read (the server finished it
//! earlier). So if the inequality fails, an excluded write was finished on the server before an
//! included one had even been sent, and no power cut could have left that image: a failure is
//! the product's, never the client clock's. (Writes in flight together may land either way;
//! the inequality allows that, as it must.)
//!
//! Three more checks:
//! 1. every block holds zeros or a write the writer submitted to that block (not garbage, not
//!    an altered or torn block, not another block's or another run's write);
//! 2. every write acknowledged before the snapshot was asked for is included (the image is
//!    not of an older moment);
//! 3. no write submitted after the snapshot call returned is included.

use std::fmt;
use std::time::{Duration, Instant};

use crate::write_log::{block_content, decode_block, describe, Found, WriteLog, BLOCK_BYTES};

/// When the snapshot was asked for and when the call returned, on the writer's clock.
#[derive(Clone, Copy, Debug)]
pub struct CutWindow {
    pub asked: Instant,
    pub returned: Instant,
}

/// One write, by block and sequence number, and the time that matters for the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedWrite {
    pub block: u64,
    pub seq: u64,
    pub at: Instant,
}

/// What a cut that holds looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CutReport {
    /// Blocks in the image.
    pub blocks: u64,
    /// Blocks holding a write (the rest are zeros).
    pub written_blocks: u64,
    pub included: u64,
    pub excluded: u64,
    /// The last included write to be submitted, if any.
    pub latest_included: Option<TimedWrite>,
    /// The first excluded write to be acknowledged, if any.
    pub earliest_excluded: Option<TimedWrite>,
}

impl CutReport {
    /// How long the window for the moment P was: from the last included submit to the first
    /// excluded ack (`None` if either side is empty).
    pub fn slack(&self) -> Option<Duration> {
        Some(self.earliest_excluded?.at - self.latest_included?.at)
    }
}

/// Why an image is not a cut of the log at the snapshot's moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CutError {
    /// The image is not whole blocks, or is too short for the blocks the writer wrote.
    ImageSize { bytes: u64, needs_blocks: u64 },
    /// The block holds something the writer never submitted to it.
    NotAWrite { block: u64, found: Found },
    /// `included` was submitted after `excluded` was acknowledged.
    NotACut {
        included: TimedWrite,
        excluded: TimedWrite,
    },
    /// A write acknowledged before the snapshot was asked for is missing.
    Stale {
        block: u64,
        holds: Option<u64>,
        acked_before: u64,
    },
    /// The block holds a write submitted after the snapshot call returned.
    TooLate {
        block: u64,
        seq: u64,
        after: Duration,
    },
}

impl fmt::Display for CutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CutError::ImageSize {
                bytes,
                needs_blocks,
            } => write!(
                f,
                "the image has {bytes} bytes: not whole {BLOCK_BYTES}-byte blocks, or fewer \
                 than the {needs_blocks} blocks written"
            ),
            CutError::NotAWrite { block, found } => write!(
                f,
                "block {block} (byte {}) holds {found:?}: not zeros nor a write submitted to it",
                block * BLOCK_BYTES as u64
            ),
            CutError::NotACut { included, excluded } => write!(
                f,
                "not a cut: block {} holds write #{}, submitted {:?} after write #{} to block \
                 {} was acknowledged, yet block {} does not hold #{} (or anything later)",
                included.block,
                included.seq,
                included.at - excluded.at,
                excluded.seq,
                excluded.block,
                excluded.block,
                excluded.seq
            ),
            CutError::Stale {
                block,
                holds,
                acked_before,
            } => write!(
                f,
                "block {block} holds {}, but write #{acked_before} to it was acknowledged \
                 before the snapshot was asked for",
                holds.map_or("zeros".into(), |s| format!("write #{s}"))
            ),
            CutError::TooLate { block, seq, after } => write!(
                f,
                "block {block} holds write #{seq}, submitted {after:?} after the snapshot call \
                 returned"
            ),
        }
    }
}

impl std::error::Error for CutError {}

impl WriteLog {
    /// Check that `image` (a whole volume image, block 0 first) is a crash-consistent cut of
    /// this log taken within `window` (see the module's doc for the rules).
    pub fn check_cut(&self, image: &[u8], window: CutWindow) -> Result<CutReport, CutError> {
        let bytes = image.len() as u64;
        let needs_blocks = self.blocks().last().map_or(0, |b| b + 1);
        if !image.len().is_multiple_of(BLOCK_BYTES) || bytes / (BLOCK_BYTES as u64) < needs_blocks {
            return Err(CutError::ImageSize {
                bytes,
                needs_blocks,
            });
        }
        let mut report = CutReport {
            blocks: bytes / BLOCK_BYTES as u64,
            written_blocks: 0,
            included: 0,
            excluded: 0,
            latest_included: None,
            earliest_excluded: None,
        };
        let (mut stale, mut too_late) = (None, None);
        for (block, data) in (0u64..).zip(image.chunks_exact(BLOCK_BYTES)) {
            let holds = self.held_write(block, data)?;
            report.written_blocks += u64::from(holds.is_some());
            self.split_block(block, holds, &mut report);
            if stale.is_none() {
                stale = self.stale(block, holds, window.asked);
            }
            if too_late.is_none() {
                too_late = self.too_late(block, holds, window.returned);
            }
        }
        if let (Some(included), Some(excluded)) = (report.latest_included, report.earliest_excluded)
        {
            if included.at >= excluded.at {
                return Err(CutError::NotACut { included, excluded });
            }
        }
        match stale.or(too_late) {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// The write `data` is, if it is one the writer submitted to `block`; `None` for zeros.
    fn held_write(&self, block: u64, data: &[u8]) -> Result<Option<u64>, CutError> {
        if data.iter().all(|b| *b == 0) {
            return Ok(None);
        }
        let not_a_write = || CutError::NotAWrite {
            block,
            found: describe(data),
        };
        let stamp = decode_block(data).ok_or_else(not_a_write)?;
        let submitted = self.writes(block).iter().any(|w| w.seq == stamp.seq);
        let intact = data == block_content(stamp.seed, stamp.block, stamp.seq).as_slice();
        if stamp.seed != self.seed() || stamp.block != block || !submitted || !intact {
            return Err(not_a_write());
        }
        Ok(Some(stamp.seq))
    }

    /// Counts `block`'s writes as included (up to `holds`) or excluded, keeping the latest
    /// included submit and the earliest excluded ack.
    fn split_block(&self, block: u64, holds: Option<u64>, report: &mut CutReport) {
        for w in self.writes(block) {
            if holds.is_some_and(|h| w.seq <= h) {
                report.included += 1;
                let t = TimedWrite {
                    block,
                    seq: w.seq,
                    at: w.submitted,
                };
                if report.latest_included.is_none_or(|l| t.at > l.at) {
                    report.latest_included = Some(t);
                }
            } else {
                report.excluded += 1;
                let Some(at) = w.acked else { continue };
                let t = TimedWrite {
                    block,
                    seq: w.seq,
                    at,
                };
                if report.earliest_excluded.is_none_or(|e| t.at < e.at) {
                    report.earliest_excluded = Some(t);
                }
            }
        }
    }

    /// A write to `block` acknowledged before `asked` that the image lacks.
    fn stale(&self, block: u64, holds: Option<u64>, asked: Instant) -> Option<CutError> {
        let last = self
            .writes(block)
            .iter()
            .filter(|w| w.acked.is_some_and(|a| a < asked))
            .map(|w| w.seq)
            .next_back()?;
        (holds < Some(last)).then_some(CutError::Stale {
            block,
            holds,
            acked_before: last,
        })
    }

    /// The write `block` holds, if it was submitted after `returned`.
    fn too_late(&self, block: u64, holds: Option<u64>, returned: Instant) -> Option<CutError> {
        let seq = holds?;
        let w = self.writes(block).iter().find(|w| w.seq == seq)?;
        (w.submitted > returned).then(|| CutError::TooLate {
            block,
            seq,
            after: w.submitted - returned,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write_log::Stamp;

    const BLOCKS: u64 = 4;
    const BLOCKS_USIZE: usize = 4;

    /// A log built from explicit times (milliseconds after `t0`).
    struct Run {
        t0: Instant,
        log: WriteLog,
    }

    impl Run {
        fn new() -> Run {
            Run {
                t0: Instant::now(),
                log: WriteLog::new(9),
            }
        }

        fn at(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }

        /// Write to `block` submitted at `sent`, acknowledged at `acked` (None: unknown).
        fn write(&mut self, block: u64, sent: u64, acked: Option<u64>) -> u64 {
            let seq = self.log.begin_at(block, self.at(sent)).expect("free block");
            match acked {
                Some(a) => self.log.acked_at(block, seq, self.at(a)),
                None => self.log.unknown(block, seq),
            }
            seq
        }

        fn window(&self, asked: u64, returned: u64) -> CutWindow {
            CutWindow {
                asked: self.at(asked),
                returned: self.at(returned),
            }
        }

        /// An image of `BLOCKS` blocks holding `held` (block, seq); zeros elsewhere.
        fn image(&self, held: &[(u64, u64)]) -> Vec<u8> {
            let mut img = vec![0u8; BLOCKS_USIZE * BLOCK_BYTES];
            for &(block, seq) in held {
                let at = usize::try_from(block).expect("small block") * BLOCK_BYTES;
                img[at..at + BLOCK_BYTES].copy_from_slice(&block_content(9, block, seq));
            }
            img
        }
    }

    #[test]
    fn the_volume_at_a_moment_is_a_cut_and_concurrent_writes_may_fall_either_way() {
        let mut r = Run::new();
        let a1 = r.write(0, 1, Some(2));
        let b1 = r.write(1, 1, Some(3));
        // In flight together around the snapshot: a2 in, b2 out is a valid moment.
        let a2 = r.write(0, 10, Some(20));
        let _b2 = r.write(1, 12, Some(18));
        let _c1 = r.write(2, 30, Some(31));
        let report = r
            .log
            .check_cut(&r.image(&[(0, a2), (1, b1)]), r.window(5, 25))
            .expect("a cut");
        assert_eq!(
            (report.blocks, report.written_blocks),
            (BLOCKS, 2),
            "{report:?}"
        );
        assert_eq!((report.included, report.excluded), (3, 2), "{report:?}");
        assert_eq!(report.slack(), Some(Duration::from_millis(8)));
        // And the image with both earlier writes is a cut too (an earlier moment).
        let earlier = r.image(&[(0, a1), (1, b1)]);
        assert!(r.log.check_cut(&earlier, r.window(5, 25)).is_ok());
    }

    #[test]
    fn a_later_write_of_one_block_with_an_earlier_of_another_is_not_a_cut() {
        let mut r = Run::new();
        let _a1 = r.write(0, 1, Some(2));
        let b1 = r.write(1, 1, Some(3));
        let b2 = r.write(1, 6, Some(8));
        // Submitted after b2 was acknowledged: no moment has a2 without b2.
        let a2 = r.write(0, 10, Some(12));
        let err = r
            .log
            .check_cut(&r.image(&[(0, a2), (1, b1)]), r.window(5, 25))
            .expect_err("not a cut");
        let want = CutError::NotACut {
            included: TimedWrite {
                block: 0,
                seq: a2,
                at: r.at(10),
            },
            excluded: TimedWrite {
                block: 1,
                seq: b2,
                at: r.at(8),
            },
        };
        assert_eq!(err, want);
        let text = err.to_string();
        assert!(
            text.contains("block 0 holds write #4") && text.contains("write #3 to block 1"),
            "{text}"
        );
    }

    #[test]
    fn content_the_writer_never_submitted_to_a_block_is_not_a_write() {
        let mut r = Run::new();
        let a1 = r.write(0, 1, Some(2));
        let w = r.window(5, 6);
        let not_a_write = |img: &[u8], block: u64| {
            let err = r.log.check_cut(img, w).expect_err("not a write");
            assert!(
                matches!(err, CutError::NotAWrite { block: b, .. } if b == block),
                "{err}"
            );
            err
        };
        // Another block's write, a never-written block with data, a sequence number never
        // submitted, another seed's write.
        let mut img = r.image(&[(1, a1)]);
        img[..BLOCK_BYTES].copy_from_slice(&block_content(9, 0, a1));
        not_a_write(&img, 1);
        not_a_write(&r.image(&[(0, a1), (3, 1)]), 3);
        not_a_write(&r.image(&[(0, a1 + 7)]), 0);
        let mut img = r.image(&[]);
        img[..BLOCK_BYTES].copy_from_slice(&block_content(8, 0, a1));
        let err = not_a_write(&img, 0);
        let stamp = Stamp {
            seed: 8,
            block: 0,
            seq: a1,
        };
        assert_eq!(
            err,
            CutError::NotAWrite {
                block: 0,
                found: Found::Stamp(stamp)
            }
        );
        // Torn and garbage.
        let mut img = r.image(&[(0, a1)]);
        img[BLOCK_BYTES / 2..BLOCK_BYTES].fill(0);
        not_a_write(&img, 0);
        let mut img = r.image(&[(0, a1)]);
        img[2 * BLOCK_BYTES + 17] = 1;
        not_a_write(&img, 2);
    }

    #[test]
    fn a_write_acknowledged_before_the_request_must_be_in_it() {
        let mut r = Run::new();
        let a1 = r.write(0, 1, Some(2));
        let a2 = r.write(0, 3, Some(4));
        let err = r
            .log
            .check_cut(&r.image(&[(0, a1)]), r.window(5, 6))
            .expect_err("stale");
        let want = CutError::Stale {
            block: 0,
            holds: Some(a1),
            acked_before: a2,
        };
        assert_eq!(err, want);
        let err = r.log.check_cut(&r.image(&[]), r.window(5, 6));
        assert!(matches!(err, Err(CutError::Stale { holds: None, .. })));
        // Acknowledged only after the request was made: either way is fine.
        assert!(r
            .log
            .check_cut(&r.image(&[(0, a1)]), r.window(3, 6))
            .is_ok());
    }

    #[test]
    fn a_write_submitted_after_the_call_returned_must_not_be_in_it() {
        let mut r = Run::new();
        let a1 = r.write(0, 1, Some(2));
        let a2 = r.write(0, 10, None);
        let err = r
            .log
            .check_cut(&r.image(&[(0, a2)]), r.window(3, 7))
            .expect_err("too late");
        let want = CutError::TooLate {
            block: 0,
            seq: a2,
            after: Duration::from_millis(3),
        };
        assert_eq!(err, want);
        assert!(r
            .log
            .check_cut(&r.image(&[(0, a1)]), r.window(3, 7))
            .is_ok());
    }

    #[test]
    fn an_image_too_short_or_not_whole_blocks_is_refused() {
        let mut r = Run::new();
        r.write(BLOCKS - 1, 1, Some(2));
        let img = r.image(&[]);
        let w = r.window(3, 4);
        let short = r.log.check_cut(&img[..BLOCK_BYTES], w);
        assert!(matches!(
            short,
            Err(CutError::ImageSize {
                needs_blocks: 4,
                ..
            })
        ));
        let ragged = r.log.check_cut(&img[..img.len() - 1], w);
        assert!(matches!(ragged, Err(CutError::ImageSize { .. })));
    }
}
