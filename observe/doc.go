// Package observe is what a herd Cache tells the world about itself: the
// [Stats] snapshot that Cache.Stats returns, and the [Recorder] a Cache calls
// as things happen, with its optional interfaces ([CacheRecorder],
// [Tracer], [EventRecorder], [ContextEventRecorder]), the [Event]s and
// results it reports and the [Histogram]s it keeps.
//
// herdprom, herdotel and herdslog are built on it. An adapter for another
// metrics system (statsd, Datadog) can be written outside this repository:
// read Stats on each scrape or flush and name each series as package
// metricdef lists it, so that a metric has one name in every system, or
// implement Recorder to push events as they happen; embed [NopRecorder] to
// implement only some of its methods, and combine recorders with
// [Recorders].
package observe
