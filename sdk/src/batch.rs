//! Several requests in one call, for plugins that declare
//! [`Description::batch`](crate::Description::batch).

use m0serve_abi::{M0Request, M0Response};

use crate::{Host, Request, Response};

/// The requests of one `handle_batch` call, each with its own response.
pub struct Batch<'a> {
    requests: &'a [*const M0Request],
    responses: &'a [*mut M0Response],
    host: &'static Host,
}

impl<'a> Batch<'a> {
    /// # Safety
    /// The slices hold the host's valid requests and responses of the call
    /// in progress, equally many.
    pub(crate) unsafe fn new(
        requests: &'a [*const M0Request],
        responses: &'a [*mut M0Response],
        host: &'static Host,
    ) -> Batch<'a> {
        Batch {
            requests,
            responses,
            host,
        }
    }

    pub fn len(&self) -> usize {
        self.requests.len().min(self.responses.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> IntoIterator for Batch<'a> {
    type Item = (Request<'a>, Response<'a>);
    type IntoIter = Box<dyn Iterator<Item = (Request<'a>, Response<'a>)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        let host = self.host;
        Box::new(
            self.requests
                .iter()
                .zip(self.responses)
                .filter(|(q, r)| !q.is_null() && !r.is_null())
                .map(move |(&q, &r)| {
                    // SAFETY: the host's valid, distinct pairs for this
                    // call (new's contract); NULLs were skipped.
                    unsafe { (Request::new(&*q, host), Response::new(r, host)) }
                }),
        )
    }
}
