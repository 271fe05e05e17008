//! [`Copies`]: the copies of one attempt in flight, its first and its
//! hedges, polled together until one of them answers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::decision::Cause;

pin_project! {
    /// The copies of one attempt still pending. The first stays where the
    /// attempt was pinned, so an attempt that needs no hedge allocates
    /// nothing for it; each hedge is boxed, so that a copy can leave while
    /// the others stay where they are pinned.
    pub(crate) struct Copies<F> {
        #[pin]
        first: Option<F>,
        first_sent: CopySent,
        hedges: Vec<(Pin<Box<F>>, CopySent)>,
    }
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
    /// What the pacing gave it when it went out.
    pub(crate) stamp: u16,
}

impl CopySent {
    /// Whether this copy is a hedge rather than the attempt it copies.
    pub(crate) fn is_hedge(&self) -> bool {
        self.paid == Some(Cause::Hedge)
    }
}

impl<F: Future> Copies<F> {
    /// An attempt whose first copy is `future`.
    pub(crate) fn new(future: F, sent: CopySent) -> Self {
        Self {
            first: Some(future),
            first_sent: sent,
            hedges: Vec::new(),
        }
    }

    /// The first copy was found pending at its first poll, at `at`: its
    /// latency counts from here. Its attempt number.
    pub(crate) fn start(self: Pin<&mut Self>, at: Instant) -> u32 {
        let sent = self.project().first_sent;
        sent.at = at;
        sent.attempt
    }

    /// When the first copy went out, or was found pending.
    pub(crate) fn started(&self) -> Instant {
        self.first_sent.at
    }

    /// Copies still pending.
    pub(crate) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.hedges.len()
    }

    /// Adds a hedge.
    pub(crate) fn push(self: Pin<&mut Self>, future: F, sent: CopySent) {
        self.project().hedges.push((Box::pin(future), sent));
    }

    /// The first copy that answered, shown to `answered` with its future
    /// (for its span) before it leaves the pending ones.
    pub(crate) fn poll_any(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        answered: impl FnOnce(&F, &F::Output),
    ) -> Poll<(F::Output, CopySent)> {
        let mut this = self.project();
        if let Some(first) = this.first.as_mut().as_pin_mut() {
            if let Poll::Ready(output) = first.poll(cx) {
                if let Some(first) = this.first.as_ref().as_pin_ref() {
                    answered(first.get_ref(), &output);
                }
                this.first.set(None);
                return Poll::Ready((output, *this.first_sent));
            }
        }
        for index in 0..this.hedges.len() {
            if let Poll::Ready(output) = this.hedges[index].0.as_mut().poll(cx) {
                let (future, sent) = this.hedges.remove(index);
                answered(&future, &output);
                return Poll::Ready((output, sent));
            }
        }
        Poll::Pending
    }

    /// Drops every pending copy, which cancels it, telling `cancelled` of
    /// each.
    pub(crate) fn cancel(self: Pin<&mut Self>, mut cancelled: impl FnMut(CopySent)) {
        let mut this = self.project();
        if this.first.is_some() {
            this.first.set(None);
            cancelled(*this.first_sent);
        }
        for (future, sent) in this.hedges.drain(..) {
            drop(future);
            cancelled(sent);
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
            stamp: 0,
        }
    }

    #[tokio::test]
    async fn the_first_copy_to_answer_leaves_and_the_rest_can_be_cancelled() {
        type Boxed = Pin<Box<dyn Future<Output = u32> + Send>>;
        let mut copies: Pin<Box<Copies<Boxed>>> =
            Box::pin(Copies::new(Box::pin(pending()), sent(1)));
        copies.as_mut().push(Box::pin(ready(2)), sent(2));
        copies.as_mut().push(Box::pin(pending()), sent(3));
        let mut cx = Context::from_waker(Waker::noop());
        let mut shown = None;
        let Poll::Ready((output, from)) = copies
            .as_mut()
            .poll_any(&mut cx, |_, out| shown = Some(*out))
        else {
            panic!("the second copy is ready");
        };
        assert_eq!(
            (output, from.attempt, from.is_hedge(), shown),
            (2, 2, true, Some(2))
        );
        assert_eq!(copies.len(), 2);
        assert!(copies.as_mut().poll_any(&mut cx, |_, _| ()).is_pending());
        let mut cancelled = Vec::new();
        copies.as_mut().cancel(|sent| cancelled.push(sent.attempt));
        assert_eq!((cancelled, copies.len()), (vec![1, 3], 0));
        assert!(!sent(1).is_hedge());
    }

    #[tokio::test]
    async fn a_first_copy_that_answers_leaves_no_copy_pending() {
        let mut copies = Box::pin(Copies::new(ready(7), sent(1)));
        let mut cx = Context::from_waker(Waker::noop());
        let mut shown = None;
        let Poll::Ready((output, from)) = copies
            .as_mut()
            .poll_any(&mut cx, |_, out| shown = Some(*out))
        else {
            panic!("ready");
        };
        assert_eq!((output, from.attempt, shown), (7, 1, Some(7)));
        assert_eq!(copies.len(), 0);
    }
}
