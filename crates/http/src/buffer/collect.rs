//! Reading a response body up to a limit: to its end, to its first error, or
//! to the first byte past the limit, whichever comes first.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use ::http::HeaderMap;
use bytes::{Buf, Bytes, BytesMut};
use http_body::Body;

use super::body::BufferedBody;

/// The body being read, and what has been read of it.
/// How far a response body is read ahead: up to `limit` bytes, and with
/// `known_length_only` only a body whose `content-length` says it fits, so
/// that event streams and chunked downloads pass through untouched.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadAhead {
    pub(super) limit: usize,
    pub(super) known_length_only: bool,
}

impl ReadAhead {
    /// The limit to read the body of a response with these headers up to,
    /// or `None` to hand it on untouched.
    pub(super) fn limit_for(&self, headers: &HeaderMap) -> Option<usize> {
        if !self.known_length_only {
            return Some(self.limit);
        }
        // Off: nothing to look up. (An empty body, all a zero limit would
        // read, cannot be cut short.)
        if self.limit == 0 {
            return None;
        }
        let length = headers
            .get(::http::header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()?;
        (length <= u64::try_from(self.limit).unwrap_or(u64::MAX)).then_some(self.limit)
    }
}

pub(super) struct Collect<B> {
    body: B,
    // Most bodies within the limit arrive as one chunk: it is kept apart,
    // so that reading one allocates nothing.
    first: Option<Bytes>,
    chunks: VecDeque<Bytes>,
    read: u64,
    limit: u64,
    trailers: Option<HeaderMap>,
}

/// How reading ended.
pub(super) enum Collected {
    /// The body ended within the limit.
    Whole,
    /// The body is longer than the limit, by its size hint or by what was read.
    OverLimit,
}

impl<B> Collect<B>
where
    B: Body + Unpin,
{
    pub(super) fn new(body: B, limit: usize) -> Self {
        Self {
            body,
            first: None,
            chunks: VecDeque::new(),
            read: 0,
            limit: u64::try_from(limit).unwrap_or(u64::MAX),
            trailers: None,
        }
    }

    /// Reads frames until the body ends, fails or passes the limit. A body
    /// whose size hint already says it is longer is not read at all, so a
    /// large download starts streaming at once.
    pub(super) fn poll_collect(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Collected, B::Error>> {
        loop {
            if self.trailers.is_some() || self.body.is_end_stream() {
                return Poll::Ready(Ok(Collected::Whole));
            }
            if self.read.saturating_add(self.body.size_hint().lower()) > self.limit {
                return Poll::Ready(Ok(Collected::OverLimit));
            }
            let Some(frame) = ready!(Pin::new(&mut self.body).poll_frame(cx)) else {
                return Poll::Ready(Ok(Collected::Whole));
            };
            match frame?.into_data() {
                Ok(mut data) => {
                    let len = data.remaining();
                    if len == 0 {
                        continue;
                    }
                    let data = data.copy_to_bytes(len);
                    match self.first {
                        None => self.first = Some(data),
                        Some(_) => self.chunks.push_back(data),
                    }
                    self.read = self.read.saturating_add(len as u64);
                    if self.read > self.limit {
                        return Poll::Ready(Ok(Collected::OverLimit));
                    }
                }
                // Trailers end a body; a frame of an unknown kind carries
                // nothing to serve again.
                Err(frame) => self.trailers = frame.into_trailers().ok(),
            }
        }
    }

    /// The body for the caller, once [`poll_collect`](Self::poll_collect)
    /// said how reading ended.
    /// `body` handed on as it is, nothing read ahead.
    pub(super) fn untouched(body: B) -> BufferedBody<B> {
        BufferedBody::streaming(VecDeque::new(), body)
    }

    pub(super) fn into_body(self, collected: Collected) -> BufferedBody<B> {
        match self.finish(collected) {
            Read::Whole { data, trailers } => BufferedBody::whole(data, trailers),
            Read::OverLimit { prefix, rest } => BufferedBody::streaming(prefix, rest),
        }
    }

    /// What was read, once [`poll_collect`](Self::poll_collect) said how
    /// reading ended.
    pub(super) fn finish(mut self, collected: Collected) -> Read<B> {
        if let (Collected::Whole, true) = (&collected, self.chunks.is_empty()) {
            return Read::Whole {
                data: self.first.unwrap_or_default(),
                trailers: self.trailers,
            };
        }
        if let Some(first) = self.first.take() {
            self.chunks.push_front(first);
        }
        match collected {
            Collected::Whole => Read::Whole {
                data: concat(self.chunks),
                trailers: self.trailers,
            },
            Collected::OverLimit => Read::OverLimit {
                prefix: self.chunks,
                rest: self.body,
            },
        }
    }
}

/// A body read ahead, as [`Collect::finish`] hands it over.
pub(super) enum Read<B> {
    /// To its end within the limit: all of it.
    Whole {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// Past the limit: the chunks read, and the rest of the body unread.
    OverLimit { prefix: VecDeque<Bytes>, rest: B },
}

/// The chunks as one contiguous `Bytes`, copied only when there are several.
fn concat(mut chunks: VecDeque<Bytes>) -> Bytes {
    if chunks.len() <= 1 {
        return chunks.pop_front().unwrap_or_default();
    }
    let len = chunks.iter().map(Bytes::len).sum();
    let mut whole = BytesMut::with_capacity(len);
    for chunk in chunks {
        whole.extend_from_slice(&chunk);
    }
    whole.freeze()
}
