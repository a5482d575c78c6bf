import AppleID
import Logging
import NIOCore
import Sessions

/// A queued revocation at Apple (`OutboxJob.Kind.appleRevoke`), run by whichever instance
/// claims it.
struct AppleRevocationJob: Sendable {
    let apple: AppleServices
    let keys: SessionKeys
    let metrics: GatewayMetrics
    let logger: Logger

    func run(_ job: OutboxJob, on _: any EventLoop) async -> Outbox.Result {
        // Queued by the CLI or by an instance whose key this one shares; one that does not
        // open here never will.
        guard let revocation = AppleRevocation(payload: job.payload), let token = keys.open(revocation.sealedToken, context: revocation.context) else {
            logger.warning("a queued revocation cannot be opened with this session.secret_file: dropped")
            return .drop
        }
        let outcome = await metrics.timeAppleCall(.revoke) { await apple.tokens.revoke(token: token, isRefreshToken: true, clientID: revocation.clientID) }
        metrics.recordAppleCall(endpoint: .revoke, outcome: outcome == .revoked ? .ok : .failed)
        switch outcome {
        case .revoked:
            return .done
        case .refused(let error):
            // Permanent: the sealed token goes with the job (`outbox_attempts_total{result="dropped"}`
            // counts it). The user can still end the app's access in Apple's Settings (Sign in with
            // Apple → the app → Stop Using), and the token dies with their consent.
            logger.error("Apple refused a token revocation for good: given up, the token is dropped",
                         metadata: ["error": "\(error)", "client_id": "\(revocation.clientID)", "attempt": .stringConvertible(job.attempts + 1)])
            return .drop
        case .clientMisconfigured, .transient:
            logger.warning("Apple did not confirm a token revocation: retried later", metadata: ["outcome": "\(outcome)", "attempt": .stringConvertible(job.attempts + 1)])
            return .retry
        }
    }
}
