//! The baseline's plain-HTTP admin endpoint (`GET /stats`, `POST /reset`) and
//! [`BaselineAdmin`], the harness's client of it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};

use super::{BaselineStats, Ctx};

/// Timeout of one [`BaselineAdmin`] request.
const ADMIN_CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The admin routes over the running baseline.
pub(super) fn router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/stats", get(|State(ctx): State<Arc<Ctx>>| async move { axum::Json(ctx.stats()) }))
        .route(
            "/reset",
            post(|State(ctx): State<Arc<Ctx>>| async move {
                ctx.stats.reset();
                "reset\n"
            }),
        )
        .with_state(ctx)
}

/// A client of a running baseline's admin endpoint.
#[derive(Debug, Clone)]
pub struct BaselineAdmin {
    /// The address the baseline printed as `{"admin":"<addr>"}`.
    pub addr: SocketAddr,
}

impl BaselineAdmin {
    /// A client of the baseline serving at `addr`.
    pub fn new(addr: SocketAddr) -> BaselineAdmin {
        BaselineAdmin { addr }
    }

    /// Reads the current stats.
    ///
    /// # Errors
    /// Fails when the endpoint cannot be reached, answers other than 200, or sends no stats.
    pub async fn stats(&self) -> Result<BaselineStats> {
        let body = self.request("GET", "/stats").await?;
        serde_json::from_str(&body).context("failed to parse the baseline stats")
    }

    /// Zeroes the counters and the percentile samples.
    ///
    /// # Errors
    /// Fails when the endpoint cannot be reached or answers other than 200.
    pub async fn reset(&self) -> Result<()> {
        self.request("POST", "/reset").await.map(drop)
    }

    async fn request(&self, method: &str, path: &str) -> Result<String> {
        let (code, body) = testenv::http::request(self.addr, method, path, None, ADMIN_CLIENT_TIMEOUT)
            .await
            .with_context(|| format!("failed to call baseline admin {method} {path}"))?;
        if code != 200 {
            bail!("baseline admin {method} {path} answered {code}");
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}
