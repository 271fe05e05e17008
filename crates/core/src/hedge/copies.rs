//! [`Copies`]: the copies of one attempt in flight, its first and its
//! hedges, polled together until one of them answers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Instant;

use crate::decision::Cause;

/// The copies of one attempt still pending. Each is boxed, so that a copy
/// can leave while the others stay where they are pinned.
pub(crate) struct Copies<F> {
    pending: Vec<Copy<F>>,
}

struct Copy<F> {
    future: Pin<Box<F>>,
    sent: CopySent,
}

/// When and as what a copy went out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopySent {
    /// When it went out: its latency is measured from here.
    pub(crate) at: Instant,
    /// Its number among the request's attempts, from 1.
    pub(crate) attempt: u32,
    /// What the budget was paid for it: a hedge is, the attempt it copies
    /// may have been (a retry).
    pub(crate) paid: Option<Cause>,
}

impl CopySent {
    /// Whether this copy is a hedge rather than the attempt it copies.
    pub(crate) fn is_hedge(&self) -> bool {
        self.paid == Some(Cause::Hedge)
    }
}

impl<F: Future> Copies<F> {
    /// An attempt with room for `max` copies, its first one `future`.
    pub(crate) fn new(future: F, sent: CopySent, max: usize) -> Self {
        let mut pending = Vec::with_capacity(max);
        pending.push(Copy {
            future: Box::pin(future),
            sent,
        });
        Self { pending }
    }

    /// Copies still pending.
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Adds a hedge.
    pub(crate) fn push(&mut self, future: F, sent: CopySent) {
        self.pending.push(Copy {
            future: Box::pin(future),
            sent,
        });
    }

    /// The first copy that answered, its future (for its span) and how it
    /// went out; it leaves the pending ones.
    pub(crate) fn poll_any(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<(F::Output, Pin<Box<F>>, CopySent)> {
        for index in 0..self.pending.len() {
            if let Poll::Ready(output) = self.pending[index].future.as_mut().poll(cx) {
                let Copy { future, sent } = self.pending.remove(index);
                return Poll::Ready((output, future, sent));
            }
        }
        Poll::Pending
    }

    /// Drops every pending copy, which cancels it, telling `cancelled` of
    /// each.
    pub(crate) fn cancel(&mut self, mut cancelled: impl FnMut(CopySent)) {
        for copy in self.pending.drain(..) {
            drop(copy.future);
            cancelled(copy.sent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::{pending, ready};
    use std::task::Waker;

    fn sent(attempt: u32) -> CopySent {
        CopySent {
            at: Instant::now(),
            attempt,
            paid: (attempt > 1).then_some(Cause::Hedge),
        }
    }

    #[tokio::test]
    async fn the_first_copy_to_answer_leaves_and_the_rest_can_be_cancelled() {
        type Boxed = Pin<Box<dyn Future<Output = u32> + Send>>;
        let mut copies: Copies<Boxed> = Copies::new(Box::pin(pending()), sent(1), 3);
        copies.push(Box::pin(ready(2)), sent(2));
        copies.push(Box::pin(pending()), sent(3));
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready((output, _, from)) = copies.poll_any(&mut cx) else {
            panic!("the second copy is ready");
        };
        assert_eq!((output, from.attempt, from.is_hedge()), (2, 2, true));
        assert_eq!(copies.len(), 2);
        assert!(copies.poll_any(&mut cx).is_pending());
        let mut cancelled = Vec::new();
        copies.cancel(|sent| cancelled.push(sent.attempt));
        assert_eq!((cancelled, copies.len()), (vec![1, 3], 0));
        assert!(!sent(1).is_hedge());
    }
}
