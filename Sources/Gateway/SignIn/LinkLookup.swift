import AppleID
import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import Sessions

/// `identity.link_lookup_url` (issue 14 §1): at a sign-in of a user with no link, the gateway
/// asks the app whether the Apple ID's email belongs to one of its accounts, and links it.
///
/// Only an email **Apple's identity token marks verified** and not a private relay is ever sent:
/// a relay address is made up per team by Apple and matches no legacy account, and an
/// unverified one proves nothing about who owns the account it names.
///
/// Apple's verification is half of it: it proves the person controls the address *now*, not
/// that the legacy account named by it is theirs. An account the app let someone register with
/// an address they never confirmed would go to whoever holds that address at Apple (a
/// pre-account takeover). So the app's answer links only when it says the app verified that
/// email for that account: `{"account": "42", "email_verified": true}` (a JSON `true`). Any
/// other answer links nothing; the user goes on unlinked, and the app's own confirmation step
/// (its link page and `POST /_auth/links`) remains the way.
struct LinkLookup: Sendable {
    let url: String
    /// The links API's secret, sent as the bearer token: the app knows the gateway asks.
    let secret: String
    let http: HTTPClient
    let logger: Logger
    static let timeout: TimeAmount = .seconds(3)
    struct LookupTimeout: Error, CustomStringConvertible { var description: String { "no answer within 3 s" } }

    /// What the app's answer means.
    enum Answer: Equatable, Sendable {
        /// Link to this account: the app verified the email for it.
        case account(String)
        /// No account has this email (404, `{"account": null}`), or the answer is unusable.
        case none
        /// An account, but the app does not say it verified the email: no link.
        case unverified
    }

    /// Whether this identity's email may be looked up at all.
    static func mayLookUp(_ identity: AppleIdentity) -> Bool {
        mayLookUp(email: identity.email, verified: identity.emailVerified, privateEmail: identity.isPrivateEmail)
    }

    /// Apple's claims decide: an email, `email_verified` true, not a private relay.
    static func mayLookUp(email: String?, verified: Bool?, privateEmail: Bool?) -> Bool {
        guard let email, !email.isEmpty else { return false }
        return verified == true && privateEmail != true
    }

    /// The app's `200` body: `{"account": "42", "email_verified": true}` links; an account
    /// without `email_verified` exactly JSON `true` is `unverified`; no account is `none`.
    static func answer(json body: Data) -> Answer {
        guard let decoded = try? JSONDecoder().decode(AppAnswer.self, from: body), let account = decoded.account else { return .none }
        return decoded.emailVerified == true ? .account(account) : .unverified
    }

    /// The app's JSON. `JSONDecoder` takes a `Bool` only from a JSON boolean (not `1`, not
    /// `"true"`); a value of another type reads as absent.
    private struct AppAnswer: Decodable {
        var account: String?
        var emailVerified: Bool?
        enum CodingKeys: String, CodingKey { case account, emailVerified = "email_verified" }
        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: CodingKeys.self)
            account = try? c.decodeIfPresent(String.self, forKey: .account)
            emailVerified = try? c.decodeIfPresent(Bool.self, forKey: .emailVerified)
        }
    }

    /// POST `{sub, email}` → `200 {"account": "…", "email_verified": true}` (or `null`, or 404:
    /// no account). Any other answer, or none within 3 s, is no account: a lookup never blocks a
    /// sign-in.
    func account(for identity: AppleIdentity) async -> Answer {
        guard Self.mayLookUp(identity), let email = identity.email else { return .none }
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
                return .none
            }
            return Self.answer(json: Data(bytes.readableBytesView))
        } catch {
            logger.warning("link lookup: the app did not answer; no link made", metadata: ["error": "\(error)"])
            return .none
        }
    }
}
