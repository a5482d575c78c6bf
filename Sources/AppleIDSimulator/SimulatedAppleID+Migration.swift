import Foundation
import HTTPProxy
import NIOCore

/// Team transfers (apple-sign-in.md §9.2): `/auth/usermigrationinfo` in both forms, with the
/// 60-day window, and `transfer_sub` in identity tokens during it.
extension SimulatedAppleID {
    static let transferWindow: Int64 = 60 * 86_400

    /// The app moved to team `team` at `date` (default now): the 60-day window starts.
    public func completeTransfer(toTeam team: String, at date: Int64? = nil) {
        let date = date ?? clock()
        grants.withLockedValue { $0.transfer = (team, date) }
    }

    /// The transfer id issued for `sub`, while the window is open.
    func activeTransferID(for sub: String, now: Int64) -> String? {
        grants.withLockedValue { g in
            guard let transfer = g.transfer, now - transfer.date < Self.transferWindow else { return nil }
            return g.transferIDs[sub]
        }
    }

    func migrationEndpoint(_ request: SimpleRequest) -> SimpleResponse {
        guard let form = Self.formFields(request),
              let clientID = form["client_id"], let secret = form["client_secret"],
              let authorization = request.head.headers.first(name: "authorization"), authorization.hasPrefix("Bearer ") else {
            return Self.error(.badRequest, "invalid_request")
        }
        let now = clock()
        guard team.clients[clientID] != nil,
              ClientSecretValidator(teamID: team.teamID, keys: team.keys).validate(secret, clientID: clientID, now: now) == nil else {
            return Self.error(.badRequest, "invalid_client")
        }
        let token = String(authorization.dropFirst("Bearer ".count))
        let answer: [String: Any]? = grants.withLockedValue { g in
            guard g.accessTokens[token] != nil, let transfer = g.transfer, now - transfer.date < Self.transferWindow else { return nil }
            if let sub = form["sub"], let target = form["target"] {
                // Sending team: sub → transfer id (the user must still have consented).
                guard target == transfer.team, g.users[sub] != nil,
                      g.refreshTokens.values.contains(where: { $0.sub == sub && !$0.revoked }) || g.transferIDs[sub] != nil else { return nil }
                let id = g.transferIDs[sub] ?? Grants.subject()
                g.transferIDs[sub] = id
                return ["transfer_sub": id]
            }
            if let transferSub = form["transfer_sub"] {
                // Receiving team: transfer id → the user's sub (and relay email) in the new team.
                guard let oldSub = g.transferIDs.first(where: { $0.value == transferSub })?.key, let user = g.users[oldSub] else { return nil }
                let newSub = g.transferredSubjects[transferSub] ?? Grants.subject()
                g.transferredSubjects[transferSub] = newSub
                var body: [String: Any] = ["sub": newSub]
                if user.isPrivateEmail {
                    body["email"] = "\(newSub.prefix(10).replacingOccurrences(of: ".", with: ""))@privaterelay.appleid.com"
                    body["is_private_email"] = true
                }
                return body
            }
            return nil
        }
        return answer.map(Self.json) ?? Self.error(.badRequest, "invalid_request")
    }
}
