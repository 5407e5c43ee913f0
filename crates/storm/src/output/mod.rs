//! What a run gives to read: the table and its legend ([`report`]), the SVG chart ([`chart`]),
//! the engine's metrics as a dashboard shows them ([`dashboard`]), and the simulator's document
//! ([`markdown`]: every scenario's explanation around the tables its run printed).

pub mod chart;
pub mod dashboard;
pub mod markdown;
pub mod report;
