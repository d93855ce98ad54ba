//! The response body of a fenced request, which holds the request's admission until it ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};

use crate::store::Admission;

/// A response body from [`FenceLayer`](super::FenceLayer): the inner service's body, holding
/// the request's [`Admission`] until the body has ended, failed or been dropped, so that a
/// streamed response is fenced to its last frame. Refusals and unfenced requests hold none.
///
/// The inner body is boxed (one allocation per response), which lets any body through,
/// `Unpin` or not, without unsafe pin projection.
pub struct FencedBody<B> {
    inner: Pin<Box<B>>,
    admission: Option<Admission>,
}

impl<B> FencedBody<B> {
    pub(super) fn holding(inner: B, admission: Admission) -> Self {
        FencedBody {
            inner: Box::pin(inner),
            admission: Some(admission),
        }
    }

    pub(super) fn unfenced(inner: B) -> Self {
        FencedBody {
            inner: Box::pin(inner),
            admission: None,
        }
    }

    /// The admission this body holds: `None` once the body has ended, and for refusals and
    /// requests without a token.
    pub fn admission(&self) -> Option<&Admission> {
        self.admission.as_ref()
    }
}

impl<B> std::fmt::Debug for FencedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedBody")
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

impl<B: From<String>> From<String> for FencedBody<B> {
    fn from(text: String) -> Self {
        FencedBody::unfenced(B::from(text))
    }
}

impl<B: Body> Body for FencedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = this.inner.as_mut().poll_frame(cx);
        // The last frame went out (or the body failed): the request is over, let newer in.
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) || this.inner.is_end_stream() {
            this.admission = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
