import AppleID
import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import Sessions

/// `identity.link_lookup_url` (issue 14 §1): at a sign-in of a user with no link, the gateway
/// asks the app whether the Apple ID's email belongs to one of its accounts, and links it.
///
/// Only a **verified, non-relay** email is ever sent: a private-relay address is made up per
/// team by Apple and matches no legacy account, and an unverified one proves nothing about who
/// owns the account it names (linking on it would hand that account to whoever typed it).
struct LinkLookup: Sendable {
    let url: String
    /// The links API's secret, sent as the bearer token: the app knows the gateway asks.
    let secret: String
    let http: HTTPClient
    let logger: Logger
    static let timeout: TimeAmount = .seconds(3)
    struct LookupTimeout: Error, CustomStringConvertible { var description: String { "no answer within 3 s" } }

    /// Whether this identity's email may be looked up at all.
    static func mayLookUp(_ identity: AppleIdentity) -> Bool {
        guard let email = identity.email, !email.isEmpty else { return false }
        return identity.emailVerified == true && identity.isPrivateEmail != true
    }

    /// POST `{sub, email}` → `200 {"account": "…"}` (or `null`, or 404: no account). Any other
    /// answer, or none within 3 s, is no account: a lookup never blocks a sign-in.
    func account(for identity: AppleIdentity) async -> String? {
        guard Self.mayLookUp(identity), let email = identity.email else { return nil }
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "content-type", value: "application/json")
        request.headers.add(name: "authorization", value: "Bearer " + secret)
        request.headers.add(name: "user-agent", value: "sessiongate-link-lookup")
        // Each user's lookup on a connection of its own: the answer names no sub, so an answer an
        // app sent late on a kept connection would be taken for the next user's (sign-ins are rare).
        request.headers.add(name: "connection", value: "close")
        let body = (try? JSONSerialization.data(withJSONObject: ["sub": identity.subject, "email": email], options: [.sortedKeys])) ?? Data()
        request.body = .bytes(ByteBuffer(bytes: body))
        do {
            // One deadline over the head and the body: AsyncHTTPClient's ends with the head.
            let deadline = NIODeadline.now() + Self.timeout
            let response = try await http.execute(request, deadline: deadline)
            let bytes = try await withThrowingTaskGroup(of: ByteBuffer?.self) { group in
                group.addTask { try await response.body.collect(upTo: 16 * 1024) }
                group.addTask {
                    try await Task.sleep(nanoseconds: UInt64(max(0, (deadline - .now()).nanoseconds)))
                    return nil
                }
                defer { group.cancelAll() }
                guard let first = try await group.next(), let body = first else { throw LookupTimeout() }
                return body
            }
            guard response.status == .ok else {
                if response.status != .notFound { logger.warning("link lookup: the app answered \(response.status.code); no link made") }
                return nil
            }
            let object = try? JSONSerialization.jsonObject(with: Data(bytes.readableBytesView)) as? [String: Any]
            return object?["account"] as? String
        } catch {
            logger.warning("link lookup: the app did not answer; no link made", metadata: ["error": "\(error)"])
            return nil
        }
    }
}
