// Package otel traces and measures pglease with OpenTelemetry.
package otel
