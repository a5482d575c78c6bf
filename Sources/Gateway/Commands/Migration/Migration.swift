import AppleID
import AsyncHTTPClient
import GatewayConfig
import Logging
import NIOCore
import NIOPosix
import Sessions

/// App transfers (TN3159; README "Existing accounts and app transfers"): the batch job. The
/// sending team runs `export` with its key; the recipient runs `import` with its own; the
/// gateway maps at sign-in anyone an import did not reach (`TransferArrival`, the same step).
///
/// Built from values: the store, Apple's token client, the pacing and the clock. `with` builds
/// one for a configuration, over an HTTP client of its own (what `sessiongate migrate` runs).
public struct Migration: Sendable {
    let configuration: GatewayConfiguration
    let store: any SessionStore
    let tokens: AppleTokenClient
    /// The client id the job authenticates as (one of `apple.client_ids`).
    let clientID: String
    /// Tells running gateways to drop a user's sessions from their caches.
    let publish: @Sendable (FleetMessage) async -> Void
    /// Tells the app a user was mapped (`user.transferred`).
    let transferred: @Sendable (TransferredUser) async -> Void
    let pacer: Pacer
    let loop: any EventLoop
    /// The first retry's wait (doubled at each attempt) when Apple names none.
    let retryDelay: Duration
    /// Unix ms: the mapping's time, the old sessions' end, the access token's renewal.
    let now: @Sendable () -> Int64
    /// How long an old identity's revocation marker lasts (`session.absolute_timeout`, ms).
    let keep: Int64

    init(configuration: GatewayConfiguration, store: any SessionStore, tokens: AppleTokenClient, clientID: String, pacer: Pacer, retryDelay: Duration,
         loop: any EventLoop, now: @escaping @Sendable () -> Int64, publish: @escaping @Sendable (FleetMessage) async -> Void,
         transferred: @escaping @Sendable (TransferredUser) async -> Void) {
        self.configuration = configuration
        self.store = store
        self.tokens = tokens
        self.clientID = clientID
        self.publish = publish
        self.transferred = transferred
        self.pacer = pacer
        self.loop = loop
        self.retryDelay = retryDelay
        self.now = now
        self.keep = Authenticator.milliseconds(configuration.session.absoluteTimeout)
    }

    /// Runs `body` with a migration of `configuration`'s users in `store`, calling Apple over an
    /// HTTP client of its own, shut down before this returns (whether `body` throws or not).
    /// - Parameters:
    ///   - clientID: one of `apple.client_ids` (default: the first).
    ///   - perSecond: Apple calls per second at most.
    ///   - publish: tells running gateways to drop a user's sessions from their caches.
    ///   - transferred: tells the app a user was mapped (`user.transferred`; `OperatorTools.transferred`).
    /// - Throws: `MigrationError` when the configuration has no `apple:` section or `clientID`
    ///   is not one of its client ids; the key's error when it cannot be read.
    public static func with<T>(configuration: GatewayConfiguration, store: any SessionStore, clientID: String? = nil, perSecond: Double = 10,
                               retryDelay: Duration = .seconds(1), logger: Logger, now: @escaping @Sendable () -> Int64 = SessionClock.now,
                               publish: @escaping @Sendable (FleetMessage) async -> Void = { _ in },
                               transferred: @escaping @Sendable (TransferredUser) async -> Void = { _ in },
                               _ body: (Migration) async throws -> T) async throws -> T {
        guard let a = configuration.apple else { throw MigrationError("the configuration has no apple: section") }
        let client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton))
        do {
            let apple = try AppleServices(configuration: a, httpClient: client, logger: logger)
            if let clientID, !a.clientIDs.contains(clientID) { throw MigrationError("--client-id \(clientID) is not one of apple.client_ids") }
            let migration = Migration(configuration: configuration, store: store, tokens: apple.tokens, clientID: clientID ?? a.clientIDs[0],
                                      pacer: Pacer(perSecond: perSecond), retryDelay: retryDelay, loop: MultiThreadedEventLoopGroup.singleton.next(),
                                      now: now, publish: publish, transferred: transferred)
            let result = try await body(migration)
            try? await client.shutdown()
            return result
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    /// The migration endpoint's access token, renewed five minutes before Apple says it expires.
    final class AccessToken: @unchecked Sendable {
        var value = ""
        /// Unix ms (`now`).
        var renewAt = Int64.min
        /// When a refusal was last asked again with a new token (Unix ms).
        var recheckedAt: Int64? = nil
    }

    /// One call with the migration access token (`call`). Apple answers a dead token (expired
    /// early, invalidated) as it answers a refused user (`invalid_request`) or refused
    /// credentials (`invalid_client`), so a refusal is asked once more with a new token — at most
    /// once a minute, so that a run of users who revoked consent costs one extra call a minute,
    /// not one each. Before, the rest of an export was reported refused (or aborted) from the
    /// first dead token on. Answers the outcome and the Apple calls made.
    func callWithAccess(_ token: AccessToken, _ body: @escaping (String) async -> AppleMigrationOutcome) async throws -> (AppleMigrationOutcome, calls: Int) {
        let access = try await accessToken(token)
        let outcome = try await call { await body(access) }
        switch outcome {
        case .refused, .clientMisconfigured:
            guard token.recheckedAt.map({ now() - $0 >= 60_000 }) ?? true else { return (outcome, 1) }
            token.recheckedAt = now()
            token.renewAt = .min
            let fresh = try await accessToken(token)
            return (try await call { await body(fresh) }, 2)
        default:
            return (outcome, 1)
        }
    }

    func accessToken(_ current: AccessToken) async throws -> String {
        if now() < current.renewAt { return current.value }
        for attempt in 0..<3 {
            switch await tokens.migrationAccessToken(clientID: clientID) {
            case .success(let granted):
                current.value = granted.accessToken
                current.renewAt = now() + Int64(max((granted.expiresIn ?? 3600) - 300, 60)) * 1000
                return granted.accessToken
            case .clientMisconfigured(let error):
                throw MigrationError("Apple refused our client credentials (\(error)): check apple.team_id, key_id, private_key_file and client_ids (sessiongate check --online)")
            case .grantRevoked(let error): throw MigrationError("Apple refused the client_credentials grant (\(error))")
            case .transient(let reason, let retryAfter):
                if attempt == 2 { throw MigrationError("Apple did not answer: \(reason); run again") }
                try await Task.sleep(for: retryAfter.map { .seconds(min($0, 60)) } ?? retryDelay * (1 << attempt))
            case .throttled(let retryAfter):
                if attempt == 2 { throw MigrationError("Apple throttles our client (429); run again later") }
                try await Task.sleep(for: retryAfter.map { .seconds(min($0, 60)) } ?? retryDelay * (1 << attempt))
            }
        }
        throw MigrationError("unreachable")
    }

    /// One migration call, paced, retried on transient failures (3 attempts).
    func call(_ body: () async -> AppleMigrationOutcome) async throws -> AppleMigrationOutcome {
        var outcome = AppleMigrationOutcome.transient(reason: "not attempted")
        for attempt in 0..<3 {
            try await pacer.wait()
            outcome = await body()
            guard case .transient(_, let retryAfter) = outcome, attempt < 2 else { return outcome }
            try await Task.sleep(for: retryAfter.map { .seconds(min($0, 60)) } ?? retryDelay * (1 << attempt))
        }
        return outcome
    }
}
