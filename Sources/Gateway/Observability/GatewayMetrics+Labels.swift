import AppleID

/// The label sets of the gateway's families. Each is an enum whose raw values are the label
/// texts, and `GatewayMetrics.init` primes every family from `allCases`: a value cannot be
/// recorded without having been exported (at 0) from the first scrape.
///
/// Label sets declared beside their domain: `SignInFlow`, `SignInOutcome`,
/// `AnonymousWrites.Kind`, `Revocations.Source`, `OutboxJob.Kind`, and HTTPProxy's
/// `ConnectionRefusal`, `TLSHandshakeFailure`, `UpstreamErrorKind`.
extension GatewayMetrics {
    /// How admission ended for one request on a guarded route (`sessiongate_admissions_total`).
    enum AdmissionResult: Int, CaseIterable {
        case session, anonymous, unauthenticated, forbidden, storeUnavailable, appleUnavailable, linkRequired, preflight
        var label: String { ["session", "anonymous", "unauthenticated", "forbidden", "store_unavailable", "apple_unavailable", "link_required", "preflight"][rawValue] }
    }

    /// How a request to start a sign-in (`GET /login`, `POST /native/nonce`) ended: its state
    /// written, or refused before any write (`AnonymousWrites`), or the store did not answer.
    enum SignInStartOutcome: String, CaseIterable {
        case ok, throttled, busy
        case storeUnavailable = "store_unavailable"
    }

    /// The `endpoint` label of `sessiongate_apple_calls_total` and `…_apple_call_duration_seconds`.
    enum AppleEndpoint: String, CaseIterable {
        case token, refresh, revoke
    }

    /// The `outcome` label of `sessiongate_apple_calls_total`.
    enum AppleCallOutcome: String, CaseIterable {
        case ok
        case grantRevoked = "grant_revoked"
        case clientMisconfigured = "client_misconfigured"
        case unavailable, throttled, failed
    }

    /// Why a due re-validation did not call Apple (the `reason` label).
    enum DeferredAppleCall: String, CaseIterable {
        /// The token's last attempt failed; its backoff (or Apple's `Retry-After`) has not run out.
        case backoff
        /// Apple refused or throttles our client: the fleet holds back, one probe at a time.
        case circuit
        /// Failing since beyond `outage_grace`: the session is denied without asking.
        case outage
    }

    /// The `kind` label of `sessiongate_revalidations_total`.
    enum RevalidationKind: String, CaseIterable { case fresh, background, blocking }

    /// The `reason` label of `sessiongate_sessions_ended_total` (also an event's `reason`).
    enum SessionEndReason: String, Sendable, CaseIterable { case logout, replaced }

    /// The `type` label of `sessiongate_apple_notifications_total`: Apple's event type, or
    /// `unverified` for a payload that failed verification. Its description is the label text
    /// (logs and events carry it as is).
    enum NotificationType: String, CaseIterable, CustomStringConvertible {
        case emailDisabled = "email-disabled"
        case emailEnabled = "email-enabled"
        case consentRevoked = "consent-revoked"
        case accountDeleted = "account-deleted"
        case unverified, unknown

        init(_ kind: AppleNotification.Kind) {
            switch kind {
            case .emailDisabled: self = .emailDisabled
            case .emailEnabled: self = .emailEnabled
            case .consentRevoked: self = .consentRevoked
            case .accountDeleted: self = .accountDeleted
            case .unknown: self = .unknown
            }
        }

        var description: String { rawValue }
    }

    /// The `result` label of `sessiongate_apple_notifications_total`.
    enum NotificationResult: String, CaseIterable {
        case processed, duplicate, stale, rejected
        /// Not acted on yet (the store or Apple's keys did not answer): held, answered 200.
        case held
        /// Neither acted on nor held (the held queue full): answered 503.
        case storeUnavailable = "store_unavailable"
    }

    /// The `result` label of `sessiongate_held_revocation_changes_total`.
    enum HeldRevocationResult: String, CaseIterable {
        case held, applied, dropped, refused
    }

    /// The `result` label of `sessiongate_outbox_attempts_total`.
    enum OutboxAttemptResult: String, CaseIterable {
        case done
        /// Retried later.
        case failed
        /// Can never succeed.
        case dropped
    }

    /// The `result` label of `sessiongate_config_reloads_total`.
    enum ReloadResult: String, CaseIterable { case ok, invalid, refused }

    /// The `result` label of `sessiongate_session_cache_total`.
    enum SessionCacheResult: String, CaseIterable { case hit, miss }

    /// The `stream` label of `sessiongate_log_lines_dropped_total`.
    enum LogStream: String, CaseIterable {
        case stdout, stderr

        var sink: LineSink {
            switch self {
            case .stdout: .standardOutput
            case .stderr: .standardError
            }
        }
    }

    /// The `status_class` label of `sessiongate_requests_total`, in the order of
    /// `RouteMetrics.byClass` (a status's class is its index: `status / 100 - 1`, else `other`).
    enum StatusClass: String, CaseIterable {
        case informational = "1xx", success = "2xx", redirection = "3xx", clientError = "4xx", serverError = "5xx", other
    }
}
