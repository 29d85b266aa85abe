//! The admin side: a plain-HTTP JSON API (axum) to read counters, reset them, change faults
//! and query which SKRs hold what; and [`SimAdmin`], its client.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /stats[?per_skr=true]` | [`SimStats`] |
//! | `POST /reset` | 204; every counter zeroed (stored objects stay) |
//! | `PUT /faults` with [`Faults`] | 204; faults replaced |
//! | `GET /marks?resource=R&name=N[&value=V]` | [`Marks`] |
//! | `GET /skrs/{token}/objects?resource=R` | sorted names (404 for an unknown token) |
//! | `GET /healthz` | 200 |

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;

use super::state::Sim;
use super::store::Res;
use super::{Faults, Marks, SimStats};

#[derive(Deserialize)]
struct StatsQuery {
    #[serde(default)]
    per_skr: bool,
}

#[derive(Deserialize)]
struct MarksQuery {
    resource: String,
    name: String,
    value: Option<String>,
}

#[derive(Deserialize)]
struct ObjectsQuery {
    resource: String,
}

fn resource(plural: &str) -> Result<Res, (StatusCode, String)> {
    Res::from_plural(plural).ok_or_else(|| (StatusCode::BAD_REQUEST, format!("unknown resource {plural:?}")))
}

/// The admin router.
pub(super) fn router(sim: Arc<Sim>) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/stats",
            get(|State(sim): State<Arc<Sim>>, Query(q): Query<StatsQuery>| async move { Json(sim.stats(q.per_skr)) }),
        )
        .route(
            "/reset",
            post(|State(sim): State<Arc<Sim>>| async move {
                sim.reset();
                StatusCode::NO_CONTENT
            }),
        )
        .route(
            "/faults",
            put(|State(sim): State<Arc<Sim>>, Json(faults): Json<Faults>| async move {
                sim.set_faults(&faults);
                StatusCode::NO_CONTENT
            }),
        )
        .route(
            "/marks",
            get(|State(sim): State<Arc<Sim>>, Query(q): Query<MarksQuery>| async move {
                let res = resource(&q.resource)?;
                Ok::<_, (StatusCode, String)>(Json(sim.marks(res, &q.name, q.value.as_deref())))
            }),
        )
        .route(
            "/skrs/{token}/objects",
            get(|State(sim): State<Arc<Sim>>, Path(token): Path<String>, Query(q): Query<ObjectsQuery>| async move {
                let res = resource(&q.resource)?;
                sim.objects(&token, res).map(Json).ok_or_else(|| (StatusCode::NOT_FOUND, format!("no SKR {token:?}")))
            }),
        )
        .with_state(sim)
}

/// Serves the admin API.
///
/// # Errors
/// When serving fails.
pub(super) async fn run(listener: TcpListener, sim: Arc<Sim>) -> Result<()> {
    axum::serve(listener, router(sim)).await.context("failed to serve the admin API")
}

/// Client of a simulator's admin API.
#[derive(Clone, Copy, Debug)]
pub struct SimAdmin {
    addr: SocketAddr,
}

impl SimAdmin {
    /// A client for the admin API at `addr` (the `admin` address the simulator printed).
    pub fn new(addr: SocketAddr) -> Self {
        Self { addr }
    }

    async fn call<T: DeserializeOwned>(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<T> {
        let (status, body) =
            testenv::http::request(self.addr, method, path, body, testenv::http::DEFAULT_TIMEOUT).await?;
        if !(200..300).contains(&status) {
            bail!("{method} {path} answered {status}: {}", String::from_utf8_lossy(&body));
        }
        let body = if body.is_empty() { b"null".as_slice() } else { &body };
        serde_json::from_slice(body).with_context(|| format!("failed to decode the answer to {method} {path}"))
    }

    /// The counters; with `per_skr`, also per SKR.
    ///
    /// # Errors
    /// When the simulator cannot be reached or answers with an error.
    pub async fn stats(&self, per_skr: bool) -> Result<SimStats> {
        self.call("GET", if per_skr { "/stats?per_skr=true" } else { "/stats" }, None).await
    }

    /// Zeroes every counter (not the stored objects).
    ///
    /// # Errors
    /// When the simulator cannot be reached or answers with an error.
    pub async fn reset(&self) -> Result<()> {
        self.call::<()>("POST", "/reset", None).await
    }

    /// Replaces the faults in effect.
    ///
    /// # Errors
    /// When the simulator cannot be reached or answers with an error.
    pub async fn set_faults(&self, faults: &Faults) -> Result<()> {
        let body = serde_json::to_vec(faults)?;
        self.call::<()>("PUT", "/faults", Some(&body)).await
    }

    /// Which SKRs hold object `name` of `resource` (a plural, such as `moduletemplates`) with
    /// [`super::MARK_ANNOTATION`] equal to `value` (or at all, when `None`).
    ///
    /// # Errors
    /// When the simulator cannot be reached or answers with an error (an unknown resource).
    pub async fn marks(&self, resource: &str, name: &str, value: Option<&str>) -> Result<Marks> {
        let mut path = format!("/marks?resource={}&name={}", encode(resource), encode(name));
        if let Some(v) = value {
            path.push_str(&format!("&value={}", encode(v)));
        }
        self.call("GET", &path, None).await
    }

    /// Sorted names of the objects of `resource` the SKR of `token` holds.
    ///
    /// # Errors
    /// When the simulator cannot be reached or answers with an error (an unknown token).
    pub async fn objects(&self, token: &str, resource: &str) -> Result<Vec<String>> {
        self.call("GET", &format!("/skrs/{}/objects?resource={}", encode(token), encode(resource)), None).await
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
    }
}
