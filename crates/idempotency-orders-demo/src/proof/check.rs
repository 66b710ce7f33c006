//! What the proof checks, order by order, against both services' own tables.

use super::callers::{Again, Answer};
use crate::orders::ParkAt;
use crate::proxy::Losses;
use crate::{DemoError, Order, quoted_schema};
use idempotency::ClaimMode;
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;
use uuid::Uuid;

/// Both services' rows, per order reference.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    /// Orders' rows: (order id, charge id) per row.
    orders: HashMap<String, Vec<(Uuid, Uuid)>>,
    /// Payments' rows: charge ids.
    charges: HashMap<String, Vec<Uuid>>,
    /// Keys still held (in flight) in orders' and payments' key tables.
    held_keys: i64,
}

impl Tables {
    pub(crate) async fn read(database_url: &str, schema: &str) -> Result<Tables, DemoError> {
        let s = quoted_schema(schema)?;
        let client = crate::connect(database_url).await?;
        let mut tables = Tables::default();
        for row in client
            .query(
                &format!("SELECT reference, id, charge_id FROM {s}.orders"),
                &[],
            )
            .await?
        {
            tables
                .orders
                .entry(row.try_get(0)?)
                .or_default()
                .push((row.try_get(1)?, row.try_get(2)?));
        }
        for row in client
            .query(&format!("SELECT reference, id FROM {s}.charges"), &[])
            .await?
        {
            tables
                .charges
                .entry(row.try_get(0)?)
                .or_default()
                .push(row.try_get(1)?);
        }
        let held = format!(
            "SELECT (SELECT count(*) FROM {s}.{orders} WHERE lease_token IS NOT NULL) \
                  + (SELECT count(*) FROM {s}.{payments} WHERE lease_token IS NOT NULL)",
            orders = crate::orders::KEY_TABLE,
            payments = crate::payments::KEY_TABLE,
        );
        tables.held_keys = client.query_one(&held, &[]).await?.try_get(0)?;
        Ok(tables)
    }
}

/// What every order came to, and what the faults were.
#[derive(Debug)]
pub struct ProofReport {
    /// The orders service's claim mode.
    pub claim_mode: ClaimMode,
    pub(crate) answers: Vec<Answer>,
    pub(crate) replays: Vec<Again>,
    /// Where the orders process was killed, in order.
    pub kills: Vec<ParkAt>,
    /// How many kills were planned.
    pub kills_planned: usize,
    /// What the proxy in front of orders lost.
    pub to_orders: Losses,
    /// What the proxy between orders and payments lost.
    pub to_payments: Losses,
    pub(crate) tables: Tables,
    /// How long it took.
    pub took: Duration,
}

impl ProofReport {
    /// How many logical orders were sent.
    pub fn orders_sent(&self) -> usize {
        self.answers.len()
    }

    /// How many calls ended `201`.
    pub fn created(&self) -> usize {
        self.answers
            .iter()
            .filter(|a| matches!(&a.outcome, Ok(f) if f.status == 201))
            .count()
    }

    /// How many calls ended with a replay (their order ran on an attempt whose answer was
    /// lost).
    pub fn replayed(&self) -> usize {
        self.answers
            .iter()
            .filter(|a| matches!(&a.outcome, Ok(f) if f.replayed))
            .count()
    }

    /// How many attempts the callers sent in all.
    pub fn attempts(&self) -> u64 {
        self.answers
            .iter()
            .filter_map(|a| a.outcome.as_ref().ok())
            .map(|f| u64::from(f.attempts))
            .sum()
    }

    /// Rows in orders' table and in payments'.
    pub fn rows(&self) -> (usize, usize) {
        (
            self.tables.orders.values().map(Vec::len).sum(),
            self.tables.charges.values().map(Vec::len).sum(),
        )
    }

    /// Every way the run broke the promise: empty when each order was created once and
    /// charged once, each caller's answer is that order's and is replayed as it was, no key is
    /// left held, and the faults happened as planned.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for (answer, again) in self.answers.iter().zip(&self.replays) {
            let reference = &answer.request.reference;
            let orders = self
                .tables
                .orders
                .get(reference)
                .map_or(&[][..], Vec::as_slice);
            let charges = self
                .tables
                .charges
                .get(reference)
                .map_or(&[][..], Vec::as_slice);
            let fail = |what: String| format!("order {reference}: {what}");
            let final_answer = match &answer.outcome {
                Ok(f) if f.status == 201 => f,
                Ok(f) => {
                    failures.push(fail(format!("ended {} (not 201)", f.status)));
                    continue;
                }
                Err(e) => {
                    failures.push(fail(format!("no final answer: {e}")));
                    continue;
                }
            };
            if orders.len() != 1 || charges.len() != 1 {
                failures.push(fail(format!(
                    "{} orders and {} charges (one each)",
                    orders.len(),
                    charges.len()
                )));
                continue;
            }
            let (order_id, charge_id) = orders[0];
            if charges[0] != charge_id {
                failures.push(fail("the order's charge is not payments' charge".into()));
            }
            match serde_json::from_slice::<Order>(&final_answer.body) {
                Ok(order) if order.id == order_id && order.charge_id == charge_id => {}
                Ok(order) => failures.push(fail(format!(
                    "the caller was told order {} (charge {}), the table holds {order_id} \
                     (charge {charge_id})",
                    order.id, order.charge_id
                ))),
                Err(e) => failures.push(fail(format!("the answer is not an order: {e}"))),
            }
            match again {
                Ok((201, true, body)) if *body == final_answer.body => {}
                Ok((status, replayed, _)) => failures.push(fail(format!(
                    "sent again: {status} (replayed: {replayed}), not the same 201"
                ))),
                Err(e) => failures.push(fail(format!("sent again: no answer: {e}"))),
            }
        }
        let (orders, charges) = self.rows();
        if orders != self.created() || charges != self.created() {
            failures.push(format!(
                "{orders} orders and {charges} charges for {} calls that ended 201",
                self.created()
            ));
        }
        if self.tables.held_keys != 0 {
            failures.push(format!("{} keys left held", self.tables.held_keys));
        }
        if self.kills.len() != self.kills_planned {
            failures.push(format!(
                "the orders process was killed {} times of {} planned",
                self.kills.len(),
                self.kills_planned
            ));
        }
        let lost = |l: &Losses| l.requests_dropped == 0 || l.answers_dropped == 0;
        if lost(&self.to_orders) || lost(&self.to_payments) {
            failures.push("a proxy lost no request or no answer: the faults did not run".into());
        }
        failures
    }
}

impl fmt::Display for ProofReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (orders, charges) = self.rows();
        writeln!(
            f,
            "{:?}: {} orders sent, {} ended 201 ({} of them replays), {} attempts, in {:.1} s",
            self.claim_mode,
            self.orders_sent(),
            self.created(),
            self.replayed(),
            self.attempts(),
            self.took.as_secs_f64()
        )?;
        writeln!(
            f,
            "  faults: orders killed {} times ({:?}); to orders {} requests and {} answers lost \
             of {} connections; to payments {} and {} of {}",
            self.kills.len(),
            self.kills,
            self.to_orders.requests_dropped,
            self.to_orders.answers_dropped,
            self.to_orders.connections,
            self.to_payments.requests_dropped,
            self.to_payments.answers_dropped,
            self.to_payments.connections
        )?;
        writeln!(
            f,
            "  tables: {orders} orders, {charges} charges, {} keys held",
            self.tables.held_keys
        )?;
        let failures = self.failures();
        if failures.is_empty() {
            write!(
                f,
                "  held: each order created once and charged once, one answer each"
            )
        } else {
            write!(f, "  FAILED ({}):", failures.len())?;
            for failure in failures.iter().take(20) {
                write!(f, "\n    {failure}")?;
            }
            Ok(())
        }
    }
}
