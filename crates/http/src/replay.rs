//! [`ReplayBody`]: a streaming request body that records what it sends, so the
//! request can be sent again.

use std::error::Error;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use ::http::HeaderMap;
use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};

use super::body::CloneBody;

/// Default number of body bytes a [`ReplayBody`] records: 64 KiB, as in
/// linkerd. Larger bodies are uploads; re-sending one costs more than the
/// failure it would paper over.
#[doc(hidden)]
pub const DEFAULT_REPLAY_LIMIT: usize = 64 * 1024;

type BoxError = Box<dyn Error + Send + Sync>;

/// Wraps a streaming request body so the HTTP policy can send the request
/// again: every data frame sent is recorded (a reference-counted `Bytes`, not a
/// copy, when the source yields `Bytes`), up to a limit.
///
/// Copies made for retries share the recording. A copy first replays what has
/// been recorded, then, if the earlier attempt stopped reading midway (the
/// server answered 503 before the upload finished), reads on from the source
/// and records that too. So every attempt sends the same bytes, and the
/// source is read only once.
///
/// Past the limit, the recording is dropped: the attempt under way goes on
/// streaming unharmed, but there will be no retry, and its outcome is returned
/// as is. A body whose size hint already says it is larger is never recorded.
///
/// A copy that is still being sent when a newer copy starts (hyper may still
/// be writing an abandoned attempt's upload) ends with an error, so that
/// connection is closed rather than left with a truncated request. If it is
/// waiting for the source then, it is woken to end at once.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use bytes::Bytes;
/// use futures::stream;
/// use http_body::Frame;
/// use http_body_util::{BodyExt, StreamBody};
/// use tower_backoff::http::{CloneBody, ReplayBody};
///
/// let chunks = ["hello", ", ", "world"]
///     .map(|s| Ok::<_, std::io::Error>(Frame::data(Bytes::from(s))));
/// let body = ReplayBody::new(StreamBody::new(stream::iter(chunks)));
/// let copy = body.clone_body().unwrap();
///
/// // The first attempt streams the source; the retry replays it.
/// let sent = body.collect().await.unwrap().to_bytes();
/// let resent = copy.collect().await.unwrap().to_bytes();
/// assert_eq!(sent, "hello, world");
/// assert_eq!(resent, sent);
/// # }
/// ```
pub struct ReplayBody<B> {
    recording: Arc<Mutex<Recording<B>>>,
    /// Copies are numbered as they are made, so in the order attempts send them.
    copy: u64,
    /// Sent beside earlier copies (a hedge) rather than after them: it
    /// neither ends them nor is ended by them.
    concurrent: bool,
    next_chunk: usize,
    sent_bytes: u64,
    sent_trailers: bool,
    /// The whole body, when it was in memory from the start.
    in_memory: Option<Bytes>,
}

struct Recording<B> {
    source: Pin<Box<B>>,
    source_state: Source,
    chunks: Vec<Bytes>,
    chunks_read: usize,
    bytes_read: u64,
    trailers: Option<HeaderMap>,
    limit: u64,
    capped: bool,
    copies: u64,
    newest_polled: u64,
    /// The wakers of the copies waiting on the source. The source keeps the
    /// waker of the last copy that polled it only, so the others are woken
    /// here: an older copy a newer one took over from, to end; a concurrent
    /// copy, when another one read what it waits for or was dropped.
    parked: Vec<Waker>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Open,
    Ended,
    Failed,
}

impl<B: Body> ReplayBody<B> {
    /// Records up to [`DEFAULT_REPLAY_LIMIT`] bytes of `body`.
    pub fn new(body: B) -> Self {
        Self::with_limit(body, DEFAULT_REPLAY_LIMIT)
    }

    /// Records up to `limit` bytes of `body`; a body larger than that is sent
    /// once and never retried.
    pub fn with_limit(body: B, limit: usize) -> Self {
        let limit = limit as u64;
        let capped = body.size_hint().lower() > limit;
        let mut recording = Recording::new(body, limit);
        recording.capped = capped;
        Self::sharing(recording, None)
    }
}

impl<B: Default> ReplayBody<B> {
    /// A body already in memory: recorded whole from the start, whatever
    /// its size, and each copy can go out as these bytes
    /// ([`in_memory`](Self::in_memory)), which a client may copy itself.
    #[cfg(feature = "reqwest")]
    pub(crate) fn from_bytes(bytes: Bytes) -> Self {
        // The source is never read: an empty one that has ended.
        let mut recording = Recording::new(B::default(), bytes.len() as u64);
        recording.source_state = Source::Ended;
        if !bytes.is_empty() {
            recording.record(&bytes);
        }
        Self::sharing(recording, Some(bytes))
    }
}

impl<B> ReplayBody<B> {
    /// The first copy of `recording`.
    fn sharing(recording: Recording<B>, in_memory: Option<Bytes>) -> Self {
        Self {
            recording: Arc::new(Mutex::new(recording)),
            copy: 0,
            concurrent: false,
            next_chunk: 0,
            sent_bytes: 0,
            sent_trailers: false,
            in_memory,
        }
    }

    /// The whole body when it was in memory from the start
    /// ([`from_bytes`](Self::from_bytes)): the bytes every copy sends.
    #[cfg(feature = "reqwest")]
    pub(crate) fn in_memory(&self) -> Option<&Bytes> {
        self.in_memory.as_ref()
    }
}

impl<B> Recording<B> {
    /// Nothing recorded yet of `source`, to record up to `limit` bytes.
    fn new(source: B, limit: u64) -> Self {
        Self {
            source: Box::pin(source),
            source_state: Source::Open,
            chunks: Vec::new(),
            chunks_read: 0,
            bytes_read: 0,
            trailers: None,
            limit,
            capped: false,
            copies: 0,
            newest_polled: 0,
            parked: Vec::new(),
        }
    }

    fn record(&mut self, chunk: &Bytes) {
        self.chunks_read += 1;
        self.bytes_read += chunk.len() as u64;
        if self.capped {
            return;
        }
        if self.bytes_read > self.limit {
            self.capped = true;
            self.chunks = Vec::new();
        } else {
            self.chunks.push(chunk.clone());
        }
    }

    fn is_replayable(&self) -> bool {
        !self.capped && self.source_state != Source::Failed
    }

    fn wake_parked(&mut self) {
        for waker in self.parked.drain(..) {
            waker.wake();
        }
    }

    /// Wakes the parked copies but the one `own` wakes, which is running.
    fn wake_parked_but(&mut self, own: &Waker) {
        for waker in self.parked.drain(..) {
            if !waker.will_wake(own) {
                waker.wake();
            }
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Ok(mut recording) = this.recording.lock() else {
            return Poll::Ready(Some(Err(ReplayError::SourceFailed.into())));
        };
        let recording = &mut *recording;
        if this.copy < recording.newest_polled && !this.concurrent {
            return Poll::Ready(Some(Err(ReplayError::Superseded.into())));
        }
        if this.copy > recording.newest_polled && !this.concurrent {
            // Taking over from an older copy: if it waits on the source, wake
            // it, so it ends with `Superseded` and frees its connection now.
            recording.wake_parked();
            recording.newest_polled = this.copy;
        }

        if this.next_chunk < recording.chunks_read {
            let Some(chunk) = recording.chunks.get(this.next_chunk).cloned() else {
                return Poll::Ready(Some(Err(ReplayError::Capped.into())));
            };
            this.next_chunk += 1;
            this.sent_bytes += chunk.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let (Some(trailers), false) = (&recording.trailers, this.sent_trailers) {
            this.sent_trailers = true;
            return Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))));
        }
        match recording.source_state {
            Source::Open => {}
            Source::Ended => return Poll::Ready(None),
            Source::Failed => return Poll::Ready(Some(Err(ReplayError::SourceFailed.into()))),
        }

        let Poll::Ready(frame) = recording.source.as_mut().poll_frame(cx) else {
            if !recording.parked.iter().any(|w| w.will_wake(cx.waker())) {
                recording.parked.push(cx.waker().clone());
            }
            return Poll::Pending;
        };
        // What it read (or the end) is there for the others too.
        recording.wake_parked_but(cx.waker());
        let frame = match frame {
            None => {
                recording.source_state = Source::Ended;
                return Poll::Ready(None);
            }
            Some(Err(error)) => {
                recording.source_state = Source::Failed;
                return Poll::Ready(Some(Err(error.into())));
            }
            Some(Ok(frame)) => frame,
        };
        match frame.into_data() {
            Ok(mut data) => {
                let chunk = data.copy_to_bytes(data.remaining());
                recording.record(&chunk);
                this.next_chunk += 1;
                this.sent_bytes += chunk.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Err(frame) => {
                // http-body 1 has data and trailers frames only.
                let trailers = frame.into_trailers().unwrap_or_default();
                recording.trailers = Some(trailers.clone());
                this.sent_trailers = true;
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let Ok(recording) = self.recording.lock() else {
            return false;
        };
        let replayed = self.next_chunk >= recording.chunks_read
            && (recording.trailers.is_none() || self.sent_trailers);
        replayed
            && match recording.source_state {
                Source::Open => recording.source.is_end_stream(),
                Source::Ended => true,
                Source::Failed => false,
            }
    }

    fn size_hint(&self) -> SizeHint {
        let Ok(recording) = self.recording.lock() else {
            return SizeHint::default();
        };
        let to_replay = recording.bytes_read.saturating_sub(self.sent_bytes);
        match recording.source_state {
            Source::Open => {
                let source = recording.source.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(source.lower().saturating_add(to_replay));
                if let Some(upper) = source.upper() {
                    hint.set_upper(upper.saturating_add(to_replay));
                }
                hint
            }
            Source::Ended | Source::Failed => SizeHint::with_exact(to_replay),
        }
    }
}

impl<B> CloneBody for ReplayBody<B> {
    fn clone_body(&self) -> Option<Self> {
        let mut recording = self.recording.lock().ok()?;
        if !recording.is_replayable() {
            return None;
        }
        recording.copies += 1;
        Some(Self {
            recording: Arc::clone(&self.recording),
            copy: recording.copies,
            concurrent: false,
            next_chunk: 0,
            sent_bytes: 0,
            sent_trailers: false,
            in_memory: self.in_memory.clone(),
        })
    }

    fn is_replayable(&self) -> bool {
        self.recording
            .lock()
            .map(|recording| recording.is_replayable())
            .unwrap_or(false)
    }

    fn mark_concurrent(&mut self) {
        self.concurrent = true;
    }
}

impl<B> Drop for ReplayBody<B> {
    /// A copy dropped while the source still had its waker: the others
    /// waiting on it poll it again, with theirs.
    fn drop(&mut self) {
        if let Ok(mut recording) = self.recording.lock() {
            recording.wake_parked();
        }
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("ReplayBody");
        debug.field("copy", &self.copy);
        if let Ok(recording) = self.recording.lock() {
            debug
                .field("bytes_read", &recording.bytes_read)
                .field("limit", &recording.limit)
                .field("capped", &recording.capped)
                .field("source", &recording.source_state);
        }
        debug.finish_non_exhaustive()
    }
}

/// Why a copy of a [`ReplayBody`] cannot send its bytes.
#[derive(Debug)]
enum ReplayError {
    Superseded,
    Capped,
    SourceFailed,
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplayError::Superseded => "request body abandoned: a retry is sending it",
            ReplayError::Capped => "request body outgrew its replay limit",
            ReplayError::SourceFailed => "request body failed on an earlier attempt",
        })
    }
}

impl Error for ReplayError {}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use http_body_util::{BodyExt, StreamBody};

    type Frames = Vec<Result<Frame<Bytes>, std::io::Error>>;

    fn data(chunks: &[&'static str]) -> Frames {
        chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect()
    }

    fn streaming(frames: Frames) -> impl Body<Data = Bytes, Error = std::io::Error> {
        StreamBody::new(stream::iter(frames))
    }

    /// Bounded, so a body that never ends fails its test instead of hanging it.
    fn bounded<B>(body: B) -> http_body_util::Limited<B> {
        http_body_util::Limited::new(body, 1 << 16)
    }

    async fn read_all<B>(body: B) -> Bytes
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        bounded(body).collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_copy_replays_the_same_bytes() {
        let body = ReplayBody::new(streaming(data(&["a", "bc", "def"])));
        let copy = body.clone_body().unwrap();
        assert_eq!(read_all(body).await, "abcdef");
        assert!(copy.is_replayable());
        assert_eq!(copy.size_hint().exact(), Some(6));
        assert_eq!(read_all(copy).await, "abcdef");
    }

    #[tokio::test]
    async fn a_copy_yields_each_recorded_frame_once_then_ends() {
        let body = ReplayBody::new(streaming(data(&["a", "bc", "def"])));
        let mut copy = body.clone_body().unwrap();
        assert_eq!(read_all(body).await, "abcdef");
        let mut frames = Vec::new();
        while let Some(frame) = copy.frame().await {
            frames.push(frame.unwrap().into_data().unwrap());
            assert!(frames.len() <= 3, "replayed {frames:?} and more");
        }
        assert_eq!(frames, ["a", "bc", "def"]);
    }

    #[tokio::test]
    async fn a_copy_reads_on_where_an_abandoned_attempt_stopped() {
        let mut body = ReplayBody::new(streaming(data(&["1", "2", "3", "4"])));
        let copy = body.clone_body().unwrap();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "1");
        drop(body);
        assert_eq!(read_all(copy).await, "1234");
    }

    #[tokio::test]
    async fn copies_of_copies_replay_too() {
        let body = ReplayBody::new(streaming(data(&["x", "y"])));
        let second = body.clone_body().unwrap();
        let third = second.clone_body().unwrap();
        assert_eq!(read_all(body).await, "xy");
        assert_eq!(read_all(second).await, "xy");
        assert_eq!(read_all(third).await, "xy");
    }

    #[tokio::test]
    async fn trailers_are_replayed() {
        let mut trailers = HeaderMap::new();
        trailers.insert("checksum", "abc".parse().unwrap());
        let mut frames = data(&["payload"]);
        frames.push(Ok(Frame::trailers(trailers.clone())));
        let body = ReplayBody::new(streaming(frames));
        let copy = body.clone_body().unwrap();
        let sent = bounded(body).collect().await.unwrap();
        assert_eq!(sent.trailers(), Some(&trailers));
        let resent = bounded(copy).collect().await.unwrap();
        assert_eq!(resent.trailers(), Some(&trailers));
        assert_eq!(resent.to_bytes(), "payload");
    }

    #[tokio::test]
    async fn past_the_limit_the_attempt_completes_but_is_not_replayable() {
        let body = ReplayBody::with_limit(streaming(data(&["1234", "5678", "9"])), 8);
        let copy = body.clone_body().unwrap();
        assert_eq!(read_all(body).await, "123456789");
        assert!(!copy.is_replayable());
        assert!(copy.clone_body().is_none());
        // Were it sent anyway, it would fail rather than send a truncated body.
        assert!(copy.collect().await.is_err());
    }

    #[tokio::test]
    async fn exactly_the_limit_is_still_replayable() {
        let body = ReplayBody::with_limit(streaming(data(&["1234", "5678"])), 8);
        let copy = body.clone_body().unwrap();
        assert_eq!(read_all(body).await, "12345678");
        assert!(copy.is_replayable());
        assert_eq!(read_all(copy).await, "12345678");
    }

    #[test]
    fn a_body_known_to_be_too_large_is_never_recorded() {
        let body = ReplayBody::with_limit(http_body_util::Full::new(Bytes::from("0123456789")), 4);
        assert!(!body.is_replayable());
        assert!(body.clone_body().is_none());
    }

    #[tokio::test]
    async fn an_older_copy_polled_after_a_newer_one_fails() {
        let mut body = ReplayBody::new(streaming(data(&["1", "2"])));
        let mut copy = body.clone_body().unwrap();
        body.frame().await.unwrap().unwrap();
        copy.frame().await.unwrap().unwrap();
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(error.to_string().contains("abandoned"), "{error}");
        assert_eq!(read_all(copy).await, "2");
    }

    /// A waker that records whether it was woken.
    #[derive(Default)]
    struct Flag(std::sync::atomic::AtomicBool);

    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Flag {
        fn woken(&self) -> bool {
            self.0.swap(false, std::sync::atomic::Ordering::SeqCst)
        }
    }

    type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

    fn poll<B>(body: &mut ReplayBody<B>, flag: &Arc<Flag>) -> Polled
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        let waker = Waker::from(Arc::clone(flag));
        Pin::new(body).poll_frame(&mut Context::from_waker(&waker))
    }

    type Sender = futures::channel::mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;
    type Streamed = ReplayBody<
        StreamBody<futures::channel::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>>,
    >;

    /// A body fed frame by frame through the sender, and a copy of it.
    fn two_copies() -> (Sender, Streamed, Streamed) {
        let (sender, receiver) = futures::channel::mpsc::channel(1);
        let original = ReplayBody::new(StreamBody::new(receiver));
        let copy = original.clone_body().unwrap();
        (sender, original, copy)
    }

    #[test]
    fn a_copy_waiting_on_the_source_is_woken_and_ends_when_a_newer_copy_polls() {
        let (mut sender, mut older, mut newer) = two_copies();
        let (older_flag, newer_flag) = (Arc::new(Flag::default()), Arc::new(Flag::default()));

        assert!(poll(&mut older, &older_flag).is_pending());
        assert!(!older_flag.woken());
        assert!(poll(&mut newer, &newer_flag).is_pending());
        assert!(older_flag.woken(), "the abandoned copy was left asleep");
        match poll(&mut older, &older_flag) {
            Poll::Ready(Some(Err(error))) => assert!(error.to_string().contains("abandoned")),
            other => panic!("the abandoned copy did not end: {other:?}"),
        }

        // The source now wakes the newer copy, which sends what it yields.
        sender
            .try_send(Ok(Frame::data(Bytes::from_static(b"x"))))
            .unwrap();
        assert!(newer_flag.woken());
        assert!(!older_flag.woken());
        match poll(&mut newer, &newer_flag) {
            Poll::Ready(Some(Ok(frame))) => assert_eq!(frame.into_data().unwrap(), "x"),
            other => panic!("the newer copy got {other:?}"),
        }
        assert!(!newer_flag.woken(), "a copy polling again woke itself");
    }

    fn data_of(polled: Polled) -> Bytes {
        match polled {
            Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap(),
            other => panic!("not a data frame: {other:?}"),
        }
    }

    #[test]
    fn concurrent_copies_of_one_source_both_send_the_whole_body() {
        let (mut sender, mut first, mut hedge) = two_copies();
        hedge.mark_concurrent();
        let (first_flag, hedge_flag) = (Arc::new(Flag::default()), Arc::new(Flag::default()));

        assert!(poll(&mut first, &first_flag).is_pending());
        assert!(poll(&mut hedge, &hedge_flag).is_pending());
        // A hedge does not end the copy it runs beside.
        assert!(!first_flag.woken());
        assert!(poll(&mut first, &first_flag).is_pending());

        sender
            .try_send(Ok(Frame::data(Bytes::from_static(b"x"))))
            .unwrap();
        // The source wakes whichever polled it last; that one reads and
        // wakes the other, which replays what was read.
        let (reader, reader_flag, other, other_flag) = if hedge_flag.woken() {
            (&mut hedge, &hedge_flag, &mut first, &first_flag)
        } else {
            assert!(first_flag.woken(), "nobody woken");
            (&mut first, &first_flag, &mut hedge, &hedge_flag)
        };
        assert_eq!(data_of(poll(reader, reader_flag)), "x");
        assert!(other_flag.woken(), "the other copy was left asleep");
        assert_eq!(data_of(poll(other, other_flag)), "x");

        drop(sender);
        assert!(matches!(poll(&mut first, &first_flag), Poll::Ready(None)));
        assert!(matches!(poll(&mut hedge, &hedge_flag), Poll::Ready(None)));
    }

    #[test]
    fn a_dropped_copy_wakes_the_one_left_waiting_on_the_source() {
        let (mut sender, mut first, mut hedge) = two_copies();
        hedge.mark_concurrent();
        let (first_flag, hedge_flag) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
        assert!(poll(&mut first, &first_flag).is_pending());
        // The source now holds the hedge's waker only.
        assert!(poll(&mut hedge, &hedge_flag).is_pending());
        drop(hedge);
        assert!(first_flag.woken(), "the copy left waiting was not woken");
        assert!(poll(&mut first, &first_flag).is_pending());
        sender
            .try_send(Ok(Frame::data(Bytes::from_static(b"y"))))
            .unwrap();
        assert!(first_flag.woken());
        assert_eq!(data_of(poll(&mut first, &first_flag)), "y");
    }

    #[test]
    fn a_newer_copy_wakes_nothing_once_the_older_one_got_its_frame() {
        let (mut sender, mut older, mut newer) = two_copies();
        let (older_flag, newer_flag) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
        assert!(poll(&mut older, &older_flag).is_pending());
        sender
            .try_send(Ok(Frame::data(Bytes::from_static(b"x"))))
            .unwrap();
        assert!(older_flag.woken());
        assert!(poll(&mut older, &older_flag).is_ready());
        // The older copy waits on nothing: the newer one leaves it alone and
        // replays the recorded frame.
        assert!(poll(&mut newer, &newer_flag).is_ready());
        assert!(!older_flag.woken());
    }

    #[tokio::test]
    async fn a_failed_source_is_not_replayable() {
        let frames: Frames = vec![
            Ok(Frame::data(Bytes::from_static(b"part"))),
            Err(std::io::Error::other("disk gone")),
        ];
        let body = ReplayBody::new(streaming(frames));
        let copy = body.clone_body().unwrap();
        assert!(body.collect().await.is_err());
        assert!(!copy.is_replayable());
        assert!(copy.clone_body().is_none());
    }

    #[tokio::test]
    async fn an_empty_body_ends_at_once_for_every_copy() {
        let body = ReplayBody::new(http_body_util::Empty::<Bytes>::new());
        let copy = body.clone_body().unwrap();
        assert!(body.is_end_stream());
        assert!(copy.is_end_stream());
        assert_eq!(read_all(copy).await, "");
    }

    #[tokio::test]
    async fn a_copy_hints_what_is_left_to_replay_plus_the_unread_source() {
        let frames = data(&["ab", "cde"]);
        let body = ReplayBody::new(http_body_util::BodyExt::boxed(streaming(frames)));
        let mut copy = body.clone_body().unwrap();
        assert_eq!(read_all(body).await, "abcde");
        assert_eq!(copy.size_hint().exact(), Some(5));
        assert!(!copy.is_end_stream());
        copy.frame().await.unwrap().unwrap();
        assert_eq!(copy.size_hint().exact(), Some(3));
        assert!(!copy.is_end_stream());
        copy.frame().await.unwrap().unwrap();
        assert_eq!(copy.size_hint().exact(), Some(0));
        assert!(copy.is_end_stream());
    }

    #[tokio::test]
    async fn a_copy_that_caught_up_with_an_open_source_hints_the_source() {
        let full = http_body_util::Full::new(Bytes::from("0123456789"));
        let body = ReplayBody::new(full);
        assert!(!body.is_end_stream());
        let copy = body.clone_body().unwrap();
        assert_eq!(copy.size_hint().exact(), Some(10));
        assert_eq!(read_all(copy).await, "0123456789");
    }

    #[tokio::test]
    async fn the_original_hints_only_what_it_has_not_sent_yet() {
        let mut body = ReplayBody::new(http_body_util::Full::new(Bytes::from("abc")));
        assert_eq!(body.size_hint().exact(), Some(3));
        body.frame().await.unwrap().unwrap();
        assert_eq!(body.size_hint().exact(), Some(0));
    }

    #[test]
    fn a_body_of_exactly_the_limit_is_recorded() {
        let body = ReplayBody::with_limit(http_body_util::Full::new(Bytes::from("0123")), 4);
        assert!(body.is_replayable());
        assert!(body.clone_body().is_some());
    }

    #[test]
    fn debug_shows_the_copy_and_the_recording() {
        let body = ReplayBody::with_limit(http_body_util::Empty::<Bytes>::new(), 8);
        let copy = body.clone_body().unwrap();
        let debug = format!("{copy:?}");
        assert!(debug.starts_with("ReplayBody"), "{debug}");
        assert!(
            debug.contains("copy: 1") && debug.contains("limit: 8"),
            "{debug}"
        );
    }

    #[tokio::test]
    async fn a_body_from_bytes_is_recorded_whole_and_every_copy_has_the_bytes() {
        let bytes = Bytes::from("in memory");
        let body = ReplayBody::<http_body_util::Empty<Bytes>>::from_bytes(bytes.clone());
        let copy = body.clone_body().unwrap();
        assert_eq!(copy.in_memory(), Some(&bytes));
        assert_eq!(body.size_hint().exact(), Some(9));
        assert!(!body.is_end_stream());
        assert_eq!(read_all(body).await, "in memory");
        assert_eq!(read_all(copy).await, "in memory");

        let empty = ReplayBody::<http_body_util::Empty<Bytes>>::from_bytes(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.in_memory(), Some(&Bytes::new()));
        assert_eq!(read_all(empty).await, "");
        let streamed = ReplayBody::new(streaming(data(&["a"])));
        assert_eq!(streamed.in_memory(), None);
    }

    #[test]
    fn size_hint_of_the_original_is_the_source_hint() {
        let body = ReplayBody::new(http_body_util::Full::new(Bytes::from("abc")));
        assert_eq!(body.size_hint().exact(), Some(3));
    }
}
