import Foundation
import HTTPProxy
import Sessions
import TestSupport
import Testing

@testable import Gateway

/// Every value of every label set is exported from the first scrape: the families are primed
/// from the enums' `allCases`, so a value cannot be recorded without having been seen at 0.
@Suite("metric labels", .serialized, .timeLimit(.minutes(2)))
struct MetricLabelsTests {
    /// `name{label="value",…}` for each combination of the label sets, in the order given.
    static func series(_ name: String, _ sets: [(label: String, values: [String])]) -> [String] {
        sets.reduce([[String]()]) { prefixes, set in
            prefixes.flatMap { prefix in set.values.map { prefix + ["\(set.label)=\"\($0)\""] } }
        }.map { "\(name){\($0.joined(separator: ","))}" }
    }

    static func values<Label: CaseIterable & RawRepresentable>(_ type: Label.Type) -> [String] where Label.RawValue == String {
        type.allCases.map(\.rawValue)
    }

    /// The series of every family whose labels come from an enum, for a configuration with
    /// the one route `app`.
    static var expected: [String] {
        typealias M = GatewayMetrics
        return [
            series("sessiongate_sign_ins_total", [("flow", values(SignInFlow.self)), ("outcome", values(SignInOutcome.self))]),
            series("sessiongate_sign_in_starts_total", [("endpoint", values(AnonymousWrites.Kind.self)), ("outcome", values(M.SignInStartOutcome.self))]),
            series("sessiongate_apple_calls_total", [("endpoint", values(M.AppleEndpoint.self)), ("outcome", values(M.AppleCallOutcome.self))]),
            series("sessiongate_apple_call_duration_seconds_count", [("endpoint", values(M.AppleEndpoint.self))]),
            series("sessiongate_apple_calls_deferred_total", [("reason", values(M.DeferredAppleCall.self))]),
            series("sessiongate_revalidations_total", [("kind", values(M.RevalidationKind.self))]),
            series("sessiongate_revocations_total", [("source", values(Revocations.Source.self))]),
            series("sessiongate_sessions_ended_total", [("reason", values(M.SessionEndReason.self))]),
            series("sessiongate_apple_notifications_total", [("type", values(M.NotificationType.self)), ("result", values(M.NotificationResult.self))]),
            series("sessiongate_outbox_pending", [("kind", values(OutboxJob.Kind.self))]),
            series("sessiongate_outbox_oldest_seconds", [("kind", values(OutboxJob.Kind.self))]),
            series("sessiongate_outbox_attempts_total", [("kind", values(OutboxJob.Kind.self)), ("result", values(M.OutboxAttemptResult.self))]),
            series("sessiongate_config_reloads_total", [("result", values(M.ReloadResult.self))]),
            series("sessiongate_session_cache_total", [("result", values(M.SessionCacheResult.self))]),
            series("sessiongate_admissions_total", [("result", M.AdmissionResult.allCases.map(\.label))]),
            series("sessiongate_log_lines_dropped_total", [("stream", values(M.LogStream.self))]),
            series("sessiongate_connections_refused_total", [("reason", values(ConnectionRefusal.self))]),
            series("sessiongate_requests_total", [("route", ["-", "app"]), ("status_class", values(M.StatusClass.self))]),
            series("sessiongate_upstream_errors_total", [("route", ["app"]), ("kind", values(UpstreamErrorKind.self))]),
        ].flatMap { $0 }
    }

    /// The series named in `text` (Prometheus exposition), without their values.
    static func exported(_ text: String) -> Set<String> {
        Set(text.split(separator: "\n").filter { !$0.hasPrefix("#") }.compactMap { $0.split(separator: " ").first.map(String.init) })
    }

    @Test("the sessiongate process exports every label value of every family at its first scrape")
    func everyLabelAfterStart() async throws {
        let directory = try makeSecretsDirectory("labels")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let gateway = try GatewayProcess.serve(yaml: CheckServeParityTests.yaml(directory: directory, listen: 0, admin: 0))
        defer { gateway.stop() }
        let admin = try await gateway.ports().admin
        let text = try await blocking {
            let c = try RawClient(port: admin)
            try c.send("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n")
            return try c.readResponse().text
        }
        let exported = Self.exported(text)
        let missing = Self.expected.filter { !exported.contains($0) }
        #expect(missing.isEmpty, "not exported: \(missing)")
        #expect(exported.contains(#"sessiongate_apple_notifications_total{type="account-deleted",result="stale"}"#), "NotificationResult.stale is primed")
        #expect(Self.expected.count > 100, "the table is not empty: \(Self.expected.count)")
    }

    @Test("a TLS listener's handshake failures, by every reason, at 0")
    func tlsReasons() {
        let metrics = GatewayMetrics()
        metrics.primeTLS()
        let exported = Self.exported(String(decoding: metrics.exposition(), as: UTF8.self))
        let missing = Self.series("sessiongate_tls_handshake_failures_total", [("reason", Self.values(TLSHandshakeFailure.self))]).filter { !exported.contains($0) }
        #expect(missing.isEmpty, "not exported: \(missing)")
    }
}
