//! Metering: what the receipt of an admitted request is made of ([`Metered`]), and the [`Meter`]
//! that settles it into a receipt and hands it to the spool. The receipt in flight, and the usage
//! tap on the answer's body, are `metered_body`'s.
//!
//! Nothing here delays a byte: the receipt goes to the spool's queue without waiting.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use recovea_core::Timestamp;
use recovea_core::channel::JobKind;
use recovea_core::jobs::{BatchInput, book_key};
use recovea_core::media::MediaRequest;
use recovea_core::money::Nanos;
use recovea_core::pricing::PriceScope;
use recovea_core::receipt::{self, BatchFile, ProviderKey, Receipt, Settlement};
use recovea_core::snapshot::{Prices, ProviderKind};
use recovea_core::tags::Tags;
use recovea_core::usage::{Usage, UsageSource};
use recovea_providers::usage::{self, Creation, Surface, Tapped};

use crate::access_log;
use crate::jobs::NodeJobs;
use crate::metrics::{Finished, MeteredFacts, Metrics, Outcome};
use crate::spool::{SpoolSender, Written};

/// What the receipt of an admitted request needs to know of it, gathered by the request phases.
pub(crate) struct Metered {
    pub(crate) request_id: String,
    pub(crate) org_id: String,
    pub(crate) key_id: String,
    pub(crate) provider: String,
    /// Whose provider key the request went with.
    pub(crate) provider_key: ProviderKey,
    pub(crate) endpoint: String,
    pub(crate) request_model: Option<String>,
    /// The kind of the credential the request went through, for its metrics.
    pub(crate) kind: ProviderKind,
    /// Where the credential prices its models: its namespace, and the fallback price of a model
    /// without one.
    pub(crate) scope: PriceScope,
    pub(crate) stream: bool,
    pub(crate) surface: Surface,
    /// The request's estimated input tokens (the body's, estimated once when it was read), for a
    /// receipt whose answer reported no usage.
    pub(crate) input_tokens: u64,
    /// An images or audio request's own facts, for what its answer does not say: the price of
    /// its images' size and quality, the characters spoken, the audio's length.
    pub(crate) media: Option<Box<MediaRequest>>,
    pub(crate) started_at: Timestamp,
    pub(crate) prices: Prices,
    /// The request's attribution tags, for its receipt.
    pub(crate) tags: Tags,
    /// How the receipt's cost is made: from usage, or nothing for a request that cannot spend or
    /// whose spend the gateway cannot see.
    pub(crate) charge: Charge,
    /// What the request creates whose id its answer names: a batch input file, or a deferred job.
    pub(crate) creating: Option<Creating>,
    /// Settles what admission took on account with the receipt's cost and tokens (input + output):
    /// the spend-cap reservation and the key's token lane.
    pub(crate) settle: Option<Settle>,
    pub(crate) timing: Timing,
    /// Where a traced request's span learns the receipt's tokens and cost.
    pub(crate) trace: crate::trace::UsageSlot,
}

/// When a metered request was received, sent and first answered, for its access-log line and
/// latency metrics.
#[derive(Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) received_at: Instant,
    pub(crate) sent_at: Option<Instant>,
    /// From sent to the answer's head; `None` while there is none.
    pub(crate) first_byte: Option<Duration>,
}

impl Timing {
    pub(crate) fn since(received_at: Instant) -> Self {
        Self { received_at, sent_at: None, first_byte: None }
    }
}

/// How a receipt's cost is made, by the request's channel of spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Charge {
    /// From the answer's usage, or an estimate of it.
    #[default]
    Metered,
    /// Nothing: the request cannot spend (a read, a cancellation, an upload, a token count).
    Free,
    /// Nothing the gateway can see: the provider bills it where the gateway cannot read it.
    Unmetered,
}

/// What a request creates whose id its answer names.
pub(crate) enum Creating {
    /// A batch input file: the estimate of its lines, kept under the id the answer gives.
    BatchFile(BatchInput),
    /// A deferred job of `kind`, whose estimate `held` the request reserved: once the answer names
    /// the job, the reservation holds it until the book of jobs does.
    Job { kind: JobKind, held: Nanos },
}

impl Creating {
    /// What the usage tap is asked to read the id of.
    pub(crate) fn creation(&self) -> Creation {
        match self {
            Self::BatchFile(_) => Creation::File,
            Self::Job { kind, .. } => Creation::Job(*kind),
        }
    }
}

/// What a finished request's receipt settles: its cost, tokens and start (which decides the cap
/// windows it falls in), or the book key of the job it created, whose hold its reservation keeps.
pub(crate) struct Settled {
    pub(crate) cost: Nanos,
    pub(crate) tokens: u64,
    pub(crate) started_at: Timestamp,
    pub(crate) job: Option<String>,
}

/// What a request's answer made: a job (its id and hold, and the book key its reservation waits
/// under), or a batch file.
#[derive(Default)]
struct Made {
    job: Option<(String, Nanos)>,
    hold: Option<String>,
    file: Option<BatchFile>,
}

/// How many unpriced model names are remembered as already alarmed about.
const MAX_ALARMED_MODELS: usize = 1024;

/// Settles what admission took on account (see [`Settled`]).
pub(crate) type Settle = Box<dyn FnOnce(Settled) + Send + Sync>;

/// Turns what was learned into receipts and hands them to the spool.
pub(crate) struct Meter {
    pub(crate) spool: SpoolSender,
    /// Where the batch files a request uploaded are remembered until the book has them.
    jobs: Arc<NodeJobs>,
    pub(crate) node_id: String,
    /// Models already alarmed about, so that an unpriced model raises one alarm, not one per request.
    alarmed: Mutex<HashSet<String>>,
    /// Whether each receipt also writes the request's access-log line (`--access-log`).
    access_log: bool,
}

impl Meter {
    pub(crate) fn new(spool: SpoolSender, node_id: String, access_log: bool, jobs: Arc<NodeJobs>) -> Self {
        Self { spool, jobs, node_id, alarmed: Mutex::new(HashSet::new()), access_log }
    }

    /// Settles and spools the receipt of a request that ended with `status`.
    pub(crate) fn record(&self, metrics: &Metrics, request: Metered, status: u16, tapped: Tapped) {
        self.spool.send(self.settle(metrics, request, status, tapped));
    }

    /// As [`Self::record`], the receipt's line written with those of the other responses this
    /// thread finishes meanwhile: on disk once the returned future is ready.
    pub(crate) fn record_grouped(
        &self,
        metrics: &Metrics,
        request: Metered,
        status: u16,
        tapped: Tapped,
    ) -> Written {
        self.spool.send_grouped(self.settle(metrics, request, status, tapped))
    }

    /// Settles the request into its receipt: the cap reservation and token lane settled, its
    /// access-log line and metrics written.
    fn settle(&self, metrics: &Metrics, mut request: Metered, status: u16, mut tapped: Tapped) -> Receipt {
        let model = tapped.model.or_else(|| request.request_model.take());
        // The provider answered, or may have been working when the answer was cut short: the
        // input was sent, so it is estimated. An error without usage, or no connection, costs nothing.
        let estimating = (200..300).contains(&status) || status == CLIENT_CLOSED || status == 504;
        let mut estimate = if estimating {
            Usage {
                input_tokens: request.input_tokens,
                output_tokens: usage::estimate_output_tokens(tapped.output_chars),
                ..Usage::default()
            }
        } else {
            // An error the provider reported no usage for costs nothing.
            Usage::default()
        };
        let success = (200..300).contains(&status);
        let created = tapped.created.take().filter(|_| success);
        let mut settled = match request.charge {
            Charge::Metered => {
                let mut price = request.prices.table.price_in(model.as_deref(), &request.scope);
                if let Some(media) = request.media.as_deref() {
                    media_usage(
                        media,
                        &request,
                        model.as_deref(),
                        (success, estimating),
                        &mut price.price,
                        &mut tapped.usage,
                        &mut estimate,
                    );
                }
                let mut settled = receipt::settle(tapped.usage, estimate, &price);
                if tapped.partial {
                    settled.source = UsageSource::Estimated;
                }
                settled
            }
            Charge::Free => Settlement::nothing(UsageSource::Provider),
            Charge::Unmetered => Settlement::nothing(UsageSource::Unmetered),
        };
        let mut made = Made::default();
        match (request.creating.take(), created) {
            (Some(Creating::Job { held, .. }), Some(job_id)) => {
                // Its cost is the job's, settled when it ends: this request's receipt holds it.
                settled = Settlement::nothing(UsageSource::Provider);
                made.hold = Some(book_key(&request.org_id, &request.provider, &job_id));
                made.job = Some((job_id, held));
            }
            (Some(Creating::BatchFile(input)), Some(file_id)) => {
                self.jobs
                    .remember_file(book_key(&request.org_id, &request.provider, &file_id), input.clone());
                made.file = Some(BatchFile { file_id, input });
            }
            (Some(Creating::Job { kind, .. }), None) if success && kind.is_batch() => {
                tracing::warn!(request_id = %request.request_id, "a batch was created but its answer names no job the gateway can poll; it is not metered");
                settled.source = UsageSource::Unmetered;
            }
            _ => {}
        }
        if settled.source == UsageSource::Estimated {
            metrics.receipt_estimated();
        }
        if !settled.priced {
            metrics.receipt_unpriced();
            self.alarm_unpriced(model.as_deref(), settled.priced_as.as_deref());
        }
        if let Some(settle) = request.settle.take() {
            let tokens = settled.usage.input_tokens.saturating_add(settled.usage.output_tokens);
            settle(Settled { cost: settled.cost, tokens, started_at: request.started_at, job: made.hold });
        }
        crate::trace::usage_known(&request.trace, || crate::trace::KnownUsage {
            model: model.clone(),
            input_tokens: settled.usage.input_tokens,
            output_tokens: settled.usage.output_tokens,
            cost: settled.cost,
        });
        // On the clock the request started on (the shared store's, on a node that shares counters).
        let elapsed = i64::try_from(request.timing.received_at.elapsed().as_millis()).unwrap_or(i64::MAX);
        let finished_at = Timestamp(request.started_at.0.saturating_add(elapsed));
        let (kind, timing) = (request.kind, request.timing);
        let mut receipt = self.receipt(request, model, status, settled, finished_at);
        if let Some((job_id, held)) = made.job {
            receipt.job_id = Some(job_id);
            receipt.held_usd = Some(held);
        }
        receipt.batch_input = made.file;
        self.finished(metrics, &receipt, kind, &timing);
        receipt
    }

    /// The request's end ([`access_log::finish`]), from its receipt: the one place that knows
    /// everything of a metered request, its outcome final.
    fn finished(&self, metrics: &Metrics, receipt: &Receipt, kind: ProviderKind, timing: &Timing) {
        let outcome = match (timing.first_byte, receipt.status) {
            (Some(_), _) => Outcome::Forwarded,
            (None, 504) => Outcome::UpstreamTimeout,
            (None, CLIENT_CLOSED) => Outcome::ClientClosed,
            (None, _) => Outcome::UpstreamUnreachable,
        };
        let usage = receipt.usage();
        let request = Finished {
            request_id: &receipt.request_id,
            org_id: Some(&receipt.org_id),
            key_id: Some(&receipt.key_id),
            route: Some(&receipt.provider),
            provider: Some(kind),
            model: receipt.model.as_deref(),
            status: receipt.status,
            outcome,
            fail_open: None,
            cap: None,
            metered: Some(MeteredFacts {
                usage: &usage,
                cost: receipt.cost_usd,
                priced_as: receipt.priced.then_some(receipt.priced_as.as_deref()).flatten(),
                usage_estimated: receipt.usage_source == UsageSource::Estimated,
            }),
            ttfb: timing.first_byte,
            total: timing.received_at.elapsed(),
        };
        access_log::finish(metrics, self.access_log, &request);
    }

    /// The receipt, taking the request's strings rather than copying them.
    fn receipt(
        &self,
        request: Metered,
        model: Option<String>,
        status: u16,
        settled: Settlement,
        finished_at: Timestamp,
    ) -> Receipt {
        let mut receipt = Receipt {
            id: receipt::receipt_id(&request.request_id),
            request_id: request.request_id,
            org_id: request.org_id,
            key_id: request.key_id,
            provider: request.provider,
            provider_key: Some(request.provider_key),
            model,
            endpoint: request.endpoint,
            status,
            stream: request.stream,
            cost_usd: settled.cost,
            usage_source: settled.source,
            priced: settled.priced,
            price_revision: request.prices.revision,
            priced_as: settled.priced_as,
            started_at: request.started_at,
            finished_at,
            node_id: self.node_id.clone(),
            tags: request.tags,
            ..Receipt::default()
        };
        receipt.set_usage(&settled.usage);
        receipt
    }

    fn alarm_unpriced(&self, model: Option<&str>, priced_as: Option<&str>) {
        // A request that names no model has no price to set: nothing to alarm about (the receipt
        // still says priced=false, and recovea_receipts_unpriced_total counts it).
        let Some(model) = model else {
            tracing::debug!(priced_as, "a receipt without a model is costed at the fallback price");
            return;
        };
        let first = {
            let mut alarmed = self.alarmed.lock().unwrap_or_else(|p| p.into_inner());
            // Model names come from clients: keep the set bounded (alarms then repeat, never stop).
            if alarmed.len() >= MAX_ALARMED_MODELS {
                alarmed.clear();
            }
            alarmed.insert(model.to_owned())
        };
        if first {
            tracing::error!(
                model,
                priced_as,
                "ALARM: a model has no price; its receipts are costed at the fallback price with priced=false until one is set (PUT /admin/v1/prices/{{model}})"
            );
        }
    }
}

/// What an images or audio request is billed beyond what its answer said: its images at the price
/// of their size and quality (the table's `{model}#{quality}-{size}` entry, over the model's own),
/// and, when an answer carried no usage, the request's own ([`MediaRequest::unreported_usage`]):
/// exact for speech priced per character answered whole, else the estimate (an answer cut short or
/// timed out is estimated as the provider may bill it whole).
fn media_usage(
    media: &MediaRequest,
    request: &Metered,
    model: Option<&str>,
    (success, estimating): (bool, bool),
    price: &mut recovea_core::pricing::Price,
    reported: &mut Option<Usage>,
    estimate: &mut Usage,
) {
    *price = media.price(&request.prices.table, model, &request.scope, *price);
    if estimating && reported.is_none() {
        match media.unreported_usage(price) {
            (usage, true) if success => *reported = Some(usage),
            (usage, _) => *estimate = usage,
        }
    }
}

/// The status a receipt records for a client that went away before the answer's head arrived
/// (nginx's convention; no answer was sent to anyone).
pub(crate) const CLIENT_CLOSED: u16 = 499;
