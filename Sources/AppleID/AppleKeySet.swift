import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import _CryptoExtras

/// Why no key could be found for a token.
public enum AppleKeySetError: Error, Equatable, CustomStringConvertible {
    /// The key set could not be fetched: none was before, or the token's `kid` is not in the
    /// last good set and the refetch failed.
    case unavailable
    /// Apple's current set has no key with this id (after one refetch, if allowed).
    case unknownKey(String)

    public var description: String {
        switch self {
        case .unavailable: return "Apple's key set could not be fetched"
        case .unknownKey(let kid): return "no key '\(kid)' in Apple's key set"
        }
    }
}

/// Apple's public keys (`/auth/keys`, apple-sign-in.md §5), for identity tokens and
/// notifications: fetched, cached for `cacheTTL`, refetched once at once (single-flight,
/// at most every `unknownKeyRefetchInterval`) when a token names an unknown `kid`, and the
/// last good set kept when a fetch fails. While the endpoint fails, an unknown `kid` is
/// `unavailable`, never `unknownKey`: Apple may have rotated its key during the outage, so the
/// token is not known to be forged (a sign-in answers 502, not 401); the refetch is tried again
/// after `failedRefetchInterval`. Only RS256 RSA keys are kept.
public actor AppleKeySet {
    private let url: String
    private let httpClient: HTTPClient
    private let cacheTTL: TimeAmount
    private let unknownKeyRefetchInterval: TimeAmount
    private let timeout: TimeAmount
    private let logger: Logger

    private var keys: [String: _RSA.Signing.PublicKey] = [:]
    private var fetchedAt: NIODeadline? = nil
    private let failedRefetchInterval: TimeAmount
    /// When an unknown `kid` may trigger the next refetch.
    private var nextUnknownKeyRefetch = NIODeadline.uptimeNanoseconds(0)
    /// The last fetch failed: the set may be out of date.
    private var lastFetchFailed = false
    private var inFlight: Task<[String: _RSA.Signing.PublicKey], any Error>? = nil

    /// - Parameters:
    ///   - baseURL: `apple.base_url` (`https://appleid.apple.com`, or the simulator's origin).
    public init(
        baseURL: String, httpClient: HTTPClient, cacheTTL: TimeAmount = .minutes(5),
        unknownKeyRefetchInterval: TimeAmount = .seconds(30), failedRefetchInterval: TimeAmount = .seconds(1),
        timeout: TimeAmount = .seconds(5), logger: Logger
    ) {
        self.failedRefetchInterval = failedRefetchInterval
        self.url = baseURL + "/auth/keys"
        self.httpClient = httpClient
        self.cacheTTL = cacheTTL
        self.unknownKeyRefetchInterval = unknownKeyRefetchInterval
        self.timeout = timeout
        self.logger = logger
    }

    /// The key with id `kid`, never a default one: a token's `kid` must be in Apple's set.
    public func key(for kid: String) async throws -> _RSA.Signing.PublicKey {
        let now = NIODeadline.now()
        if fetchedAt.map({ now - $0 >= cacheTTL }) ?? true {
            await refresh()
        }
        if let key = keys[kid] { return key }
        if inFlight != nil {
            // Another caller's refetch is under way (perhaps for this very kid): share it.
            await refresh()
            if let key = keys[kid] { return key }
        }
        if fetchedAt == nil { throw AppleKeySetError.unavailable }
        if now >= nextUnknownKeyRefetch {
            nextUnknownKeyRefetch = now + unknownKeyRefetchInterval
            await refresh()
            if lastFetchFailed { nextUnknownKeyRefetch = now + min(failedRefetchInterval, unknownKeyRefetchInterval) }
            if let key = keys[kid] { return key }
        }
        throw lastFetchFailed ? AppleKeySetError.unavailable : AppleKeySetError.unknownKey(kid)
    }

    /// The key ids in the cached set.
    public var keyIDs: [String] { keys.keys.sorted() }

    /// Fetches the set, sharing one fetch between concurrent callers; a failure keeps the
    /// last good set.
    private func refresh() async {
        let task: Task<[String: _RSA.Signing.PublicKey], any Error>
        if let inFlight {
            task = inFlight
        } else {
            let (url, client, timeout) = (self.url, self.httpClient, self.timeout)
            task = Task { try await Self.fetch(url: url, client: client, timeout: timeout) }
            inFlight = task
        }
        do {
            let fetched = try await task.value
            keys = fetched
            fetchedAt = NIODeadline.now()
            lastFetchFailed = false
        } catch {
            lastFetchFailed = true
            logger.warning("Apple key set fetch failed; keeping the last good set", metadata: ["keys": .stringConvertible(keys.count), "error": "\(error)"])
        }
        if inFlight == task { inFlight = nil }
    }

    struct FetchFailed: Error { let reason: String }

    static func fetch(url: String, client: HTTPClient, timeout: TimeAmount) async throws -> [String: _RSA.Signing.PublicKey] {
        var request = HTTPClientRequest(url: url)
        request.headers.add(name: "user-agent", value: AppleTokenEndpoint.userAgent)
        let response = try await client.execute(request, timeout: timeout)
        let body = try await response.body.collect(upTo: 1 << 20)
        guard response.status == .ok else { throw FetchFailed(reason: "status \(response.status.code)") }
        guard let object = try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any],
              let list = object["keys"] as? [[String: Any]] else { throw FetchFailed(reason: "not a JWK set") }
        var keys: [String: _RSA.Signing.PublicKey] = [:]
        for jwk in list {
            guard jwk["kty"] as? String == "RSA", (jwk["alg"] as? String).map({ $0 == "RS256" }) ?? true,
                  let kid = jwk["kid"] as? String,
                  let n = (jwk["n"] as? String).flatMap({ Base64URL.decode(Substring($0)) }),
                  let e = (jwk["e"] as? String).flatMap({ Base64URL.decode(Substring($0)) }),
                  let key = try? _RSA.Signing.PublicKey(n: n, e: e) else { continue }
            keys[kid] = key
        }
        guard !keys.isEmpty else { throw FetchFailed(reason: "no RS256 key in the set") }
        return keys
    }
}

/// Constants of Apple's REST endpoints shared by the relying party's clients.
enum AppleTokenEndpoint {
    /// Apple asks callers of its token endpoint to send a User-Agent.
    static let userAgent = "SessionGate/0.1 (Sign in with Apple relying party)"
}
