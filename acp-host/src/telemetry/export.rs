//! Where finished spans go: the OTLP/HTTP exporter (protobuf, the official crate) and/or the
//! `--trace-out` file (one OTLP/JSON `ExportTraceServiceRequest` a line, the OTLP file
//! exporter's format), both behind one [`Fanout`] on the SDK's batch processor's thread.
//!
//! Invariants: a failed export warns once per process (then stays quiet: a dead collector is one
//! line, not one per batch), names the endpoint's failure and never a header; the HTTP client is
//! the workspace's reqwest on a current-thread runtime owned by the exporter (driven only on the
//! batch processor's thread, so no thread of its own and no dependence on the binary's runtime,
//! which may already be gone at the final flush).

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

use super::{TelemetryError, Warn};

/// The OTLP request timeout when `OTEL_EXPORTER_OTLP_TIMEOUT` says nothing (the specification's
/// default).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The collector and/or the file.
pub(super) struct Fanout {
    otlp: Option<opentelemetry_otlp::SpanExporter>,
    file: Option<Mutex<File>>,
    resource: ResourceAttributesWithSchema,
    warn: Warn,
    warned: AtomicBool,
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("otlp", &self.otlp.is_some())
            .field("file", &self.file.is_some())
            .finish_non_exhaustive()
    }
}

impl Fanout {
    pub(super) fn new(
        collector: bool,
        trace_out: Option<&Path>,
        warn: Warn,
    ) -> Result<Self, TelemetryError> {
        let file = trace_out
            .map(|path| {
                crate::fs_atomic::open_append_log(path)
                    .map(Mutex::new)
                    .map_err(|err| TelemetryError::TraceOut {
                        path: path.display().to_string(),
                        source: std::io::Error::other(err.to_string()),
                    })
            })
            .transpose()?;
        let otlp = collector
            .then(|| {
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary)
                    .with_http_client(Client::new()?)
                    // Two quick retries: a collector restarting is caught, a dead one costs the
                    // final flush a third of a second, not the default backoff's.
                    .with_retry_policy(
                        opentelemetry_otlp::RetryPolicy::default()
                            .with_max_retries(2)
                            .with_initial_delay(Duration::from_millis(50))
                            .with_max_delay(Duration::from_millis(200)),
                    )
                    .build()
                    .map_err(|err| TelemetryError::Exporter(err.to_string()))
            })
            .transpose()?;
        Ok(Self {
            otlp,
            file,
            resource: ResourceAttributesWithSchema::default(),
            warn,
            warned: AtomicBool::new(false),
        })
    }

    /// The one warning of a process's failed export.
    fn warn_once(&self, what: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            (self.warn)(what);
        }
    }

    fn write_line(&self, batch: Vec<SpanData>) {
        let Some(file) = &self.file else {
            return;
        };
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(batch, &self.resource),
        };
        let mut line = match serde_json::to_vec(&request) {
            Ok(line) => line,
            Err(err) => return self.warn_once(&format!("cannot encode spans as JSON: {err}")),
        };
        line.push(b'\n');
        let written = file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .write_all(&line);
        if let Err(err) = written {
            self.warn_once(&format!("cannot append spans to the trace file: {err}"));
        }
    }
}

impl SpanExporter for Fanout {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let Some(otlp) = &self.otlp else {
            self.write_line(batch);
            return Ok(());
        };
        let copy = self.file.is_some().then(|| batch.clone());
        if let Err(err) = otlp.export(batch).await {
            self.warn_once(&format!(
                "cannot export spans to the OpenTelemetry collector: {err}; the run goes on, spans are not sent (check OTEL_EXPORTER_OTLP_ENDPOINT)"
            ));
        }
        if let Some(copy) = copy {
            self.write_line(copy);
        }
        // A failure was reported once, here: the batch processor is told all went well.
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        if let Some(file) = &self.file {
            let _ = file
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .flush();
        }
        match &self.otlp {
            Some(otlp) => otlp.shutdown_with_timeout(timeout),
            None => Ok(()),
        }
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.resource = resource.into();
        if let Some(otlp) = &mut self.otlp {
            otlp.set_resource(resource);
        }
    }
}

/// The OTLP exporter's HTTP client: reqwest, on a runtime of its own that only the batch
/// processor's thread drives.
struct Client {
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Client")
    }
}

impl Client {
    fn new() -> Result<Self, TelemetryError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|err| TelemetryError::Exporter(err.to_string()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| TelemetryError::Exporter(err.to_string()))?;
        Ok(Self { http, runtime })
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        self.runtime.block_on(async {
            let response = self.http.execute(request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await?;
            let mut out = Response::new(body);
            *out.status_mut() = status;
            *out.headers_mut() = headers;
            Ok::<_, HttpError>(out)
        })
    }
}
