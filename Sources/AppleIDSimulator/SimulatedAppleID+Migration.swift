import Foundation
import NIOConcurrencyHelpers
import NIOCore

/// What Apple knows across teams about app transfers (apple-sign-in.md §9.2): each simulator is
/// one team's view of Apple, and the simulators of the teams taking part in a transfer share
/// one ledger (`SimulatedAppleID.start(…, ledger:)`).
///
/// - A transfer id is stable per (sending team, user, recipient team), as Apple's are, whether
///   the sending team asked for it or the user signed in at the recipient first.
/// - The sending team may ask for transfer ids before the transfer completes (TN3159's
///   preparation) and for 60 days after; the recipient may exchange them only in those 60 days.
public final class TransferLedger: Sendable {
    static let window: Int64 = 60 * 86_400

    struct Transfer { var from: String, to: String, date: Int64 }
    struct Origin { var team: String, sub: String, target: String }
    struct State {
        var teams: Set<String> = []
        var transfers: [Transfer] = []
        /// "sending team, sub, recipient team" → transfer id.
        var ids: [String: String] = [:]
        var origins: [String: Origin] = [:]
        /// "recipient team, transfer id" → the user's sub there, and back.
        var arrivals: [String: String] = [:]
        var arrivalIDs: [String: String] = [:]
    }

    let state = NIOLockedValueBox(State())
    public init() {}

    enum Window { case notYet, open, closed }

    /// Where the transfer from `from` to `to` stands at `now`.
    func window(from: String, to: String, now: Int64) -> Window {
        state.withLockedValue { s in
            guard let transfer = s.transfers.last(where: { $0.from == from && $0.to == to }) else { return .notYet }
            return now - transfer.date < Self.window ? .open : .closed
        }
    }

    /// The transfer id of `sub` of team `from` for team `to`, made on first use.
    func transferID(from: String, sub: String, to: String) -> String {
        state.withLockedValue { s in
            let key = "\(from) \(sub) \(to)"
            if let id = s.ids[key] { return id }
            let id = Grants.subject()
            s.ids[key] = id
            s.origins[id] = Origin(team: from, sub: sub, target: to)
            return id
        }
    }
}

/// Team transfers (apple-sign-in.md §9.2): `/auth/usermigrationinfo` in both forms, with the
/// 60-day window, and `transfer_sub` in the recipient's identity tokens during it.
extension SimulatedAppleID {
    /// The app moves from team `a` to team `b` at `date` (default now), with its users: each
    /// user who still consents at `a` becomes a user of `b` with a new `sub` (and a new relay
    /// address when the email is private), consent carried over. The simulators must share a
    /// ledger; `b` should register the app's client ids too.
    public static func transfer(from a: SimulatedAppleID, to b: SimulatedAppleID, at date: Int64? = nil) {
        precondition(a.ledger === b.ledger, "the two teams' simulators must share a TransferLedger")
        let date = date ?? a.clock()
        let moving = a.grants.withLockedValue { g in g.users.values.filter { g.consents($0.sub) } }
        for user in moving {
            let id = a.ledger.transferID(from: a.team.teamID, sub: user.sub, to: b.team.teamID)
            var arrived = user
            arrived.sub = Grants.subject()
            if user.isPrivateEmail { arrived.email = Grants.relayAddress(for: arrived.sub) }
            arrived.authorized = true
            b.grants.withLockedValue { $0.users[arrived.sub] = arrived }
            a.ledger.state.withLockedValue { s in
                s.arrivals["\(b.team.teamID) \(id)"] = arrived.sub
                s.arrivalIDs["\(b.team.teamID) \(arrived.sub)"] = id
            }
        }
        a.ledger.state.withLockedValue { $0.transfers.append(.init(from: a.team.teamID, to: b.team.teamID, date: date)) }
    }

    /// The `sub` at team `other` of this team's user `sub`, once a transfer moved them (tests).
    public func counterpart(of sub: String, at other: SimulatedAppleID) -> String? {
        ledger.state.withLockedValue { s in s.ids["\(team.teamID) \(sub) \(other.team.teamID)"].flatMap { s.arrivals["\(other.team.teamID) \($0)"] } }
    }

    /// The transfer id a token of this team carries for `sub`: the user arrived by a transfer
    /// whose window is open.
    func activeTransferID(for sub: String, now: Int64) -> String? {
        guard let id = ledger.state.withLockedValue({ $0.arrivalIDs["\(team.teamID) \(sub)"] }),
              let origin = ledger.state.withLockedValue({ $0.origins[id] }),
              ledger.window(from: origin.team, to: team.teamID, now: now) == .open else { return nil }
        return id
    }

    func migrationEndpoint(_ request: SimulatorRequest) -> SimulatorResponse {
        let form: [String: String]
        switch Self.formFields(request) {
        case .refused(let response): return response
        case .ok(let fields): form = fields
        }
        guard let clientID = form["client_id"], let secret = form["client_secret"] else {
            return Self.error(.badRequest, "invalid_request", "client_id and client_secret are required")
        }
        let now = clock()
        guard team.clients[clientID] != nil,
              ClientSecretValidator(teamID: team.teamID, keys: team.keys).validate(secret, clientID: clientID, now: now) == nil else {
            return Self.error(.badRequest, "invalid_client")
        }
        guard let authorization = request.head.headers.first(name: "authorization"), authorization.hasPrefix("Bearer "),
              grants.withLockedValue({ g in
                  let token = String(authorization.dropFirst("Bearer ".count))
                  return g.accessTokens[token] != nil && (g.accessTokenExpiry[token].map { now < $0 } ?? true)
              }) else {
            return Self.error(.badRequest, "invalid_request", "a live bearer access token of this team is required")
        }
        if let sub = form["sub"], let target = form["target"], form["transfer_sub"] == nil {
            // Sending team: its user's transfer id for the target team, before the transfer
            // (preparation) or within its 60 days; never for a user who revoked consent.
            guard target != team.teamID, ledger.state.withLockedValue({ $0.teams.contains(target) }) else {
                return Self.error(.badRequest, "invalid_request", "unknown target team")
            }
            guard ledger.window(from: team.teamID, to: target, now: now) != .closed else {
                return Self.error(.badRequest, "invalid_request", "the transfer period has ended")
            }
            guard grants.withLockedValue({ $0.consents(sub) }) else { return Self.error(.badRequest, "invalid_request", "unknown user or consent revoked") }
            return Self.json(["transfer_sub": ledger.transferID(from: team.teamID, sub: sub, to: target)])
        }
        if let transferSub = form["transfer_sub"], form["sub"] == nil {
            // Recipient team: the user's sub here (and the new relay address), within the window.
            guard let origin = ledger.state.withLockedValue({ $0.origins[transferSub] }), origin.target == team.teamID else {
                return Self.error(.badRequest, "invalid_request", "unknown transfer_sub")
            }
            guard ledger.window(from: origin.team, to: team.teamID, now: now) == .open else {
                return Self.error(.badRequest, "invalid_request", "not within the transfer period")
            }
            guard let sub = ledger.state.withLockedValue({ $0.arrivals["\(team.teamID) \(transferSub)"] }),
                  let user = grants.withLockedValue({ g in g.consents(sub) ? g.users[sub] : nil }) else {
                return Self.error(.badRequest, "invalid_request", "the user revoked consent")
            }
            var body: [String: Any] = ["sub": sub]
            if user.isPrivateEmail {
                body["email"] = user.email
                body["is_private_email"] = true
            }
            return Self.json(body)
        }
        return Self.error(.badRequest, "invalid_request", "either sub and target, or transfer_sub")
    }
}
