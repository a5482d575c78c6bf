import Crypto
import Foundation
import HTTPProxy
import NIOCore
import NIOHTTP1
import Sessions

/// `POST/DELETE /_auth/links` (issue 14 §1): the legacy app, having checked the person's own
/// credentials, links their Apple identity to its account; from then on every request of
/// theirs carries `X-Auth-Account`. Server to server: the app authenticates with the bearer
/// secret of `identity.links.secret_file` (without one the endpoint does not exist).
extension AuthEndpointGuard {
    /// The longest account id accepted (bytes).
    static let maximumAccountLength = 256

    func links(_ method: HTTPMethod, head: HTTPRequestHead, body: ByteBuffer, on loop: any EventLoop) async -> LocalResponse {
        guard let digest = core.secrets.linksSecretDigest else { return .error(.notFound, "no such endpoint") }
        guard Self.bearerMatches(head.headers, digest) else {
            return AuthResponses.json(.unauthorized, ["error": "unauthorized", "message": "send the identity.links secret as Authorization: Bearer"],
                                      headers: [("www-authenticate", "Bearer")])
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any],
              let sub = object["sub"] as? String, Self.isSubject(sub) else {
            return AuthResponses.json(.badRequest, ["error": "invalid_request", "message": "a JSON object with sub (the user's Apple id, as in X-Auth-User) is required"])
        }
        do {
            let store = core.store
            if method == .DELETE {
                let was = try await storeCall { try await store.unlink(sub, on: loop).get() }
                core.revocations.invalidateUser(sub, on: loop)
                return AuthResponses.json(.ok, ["sub": sub, "unlinked": was as Any? ?? NSNull()])
            }
            guard let account = object["account"] as? String, Self.isAccountID(account) else {
                return AuthResponses.json(.badRequest, ["error": "invalid_request",
                                                        "message": "account must be a non-empty string of at most \(Self.maximumAccountLength) bytes, without control characters or surrounding spaces"])
            }
            switch try await storeCall({ try await store.link(sub, to: account, on: loop).get() }) {
            case .linked:
                core.revocations.invalidateUser(sub, on: loop)
                core.logger.info("account linked", metadata: ["sub": "\(sub)"])
                return AuthResponses.json(.ok, ["sub": sub, "account": account])
            case .conflict:
                return AuthResponses.json(.conflict, ["error": "conflict", "message": "the account is linked to another Apple identity; unlink it first"])
            }
        } catch {
            return AuthResponses.json(.serviceUnavailable, ["error": "store_unavailable", "message": "the session store did not answer; retry"])
        }
    }

    /// An account id the gateway will put in a header: non-empty, bounded, no control characters,
    /// no surrounding spaces (from the links API and from a lookup alike).
    static func isAccountID(_ account: String) -> Bool {
        !account.isEmpty && account.utf8.count <= maximumAccountLength && HTTPWire.isSafeValue(account)
            && account.trimmingCharacters(in: .whitespaces) == account
    }

    /// `Authorization: Bearer <secret>`, compared by digest (constant time in the secret).
    static func bearerMatches(_ headers: HTTPHeaders, _ digest: SHA256Digest) -> Bool {
        let values = headers["authorization"]
        guard values.count == 1, let token = Authenticator.bearerToken(values[0]) else { return false }
        return SHA256.hash(data: Array(token.utf8)) == digest
    }

    /// An Apple `sub` as Apple issues them (`001234.0a1b….1234`): bounded, no spaces.
    static func isSubject(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.count <= 128 && text.utf8.allSatisfy { $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "-") || (48...57).contains($0) || (65...90).contains($0) || (97...122).contains($0) }
    }
}
