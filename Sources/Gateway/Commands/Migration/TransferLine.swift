import Foundation
import Sessions

/// One user in a transfer file (JSON Lines): what the sending team hands the recipient. As
/// Apple asks (TN3159), it names the user by the transfer id only — never the sending team's
/// `sub` or private relay address, which mean nothing (and must not be shown) to another team.
public struct TransferLine: Sendable, Equatable {
    public var transferSubject: String
    /// The legacy account linked to the user.
    public var account: String?
    public var name: String?
    /// A real (non-relay) address only.
    public var email: String?
    public var emailVerified: Bool?
    public var realUserStatus: Int?
    /// The routes whose `allow.users` named the user at the sending team.
    public var routes: [String]

    public init(transferSubject: String, account: String? = nil, name: String? = nil, email: String? = nil, emailVerified: Bool? = nil,
                realUserStatus: Int? = nil, routes: [String] = []) {
        self.transferSubject = transferSubject
        self.account = account
        self.name = name
        self.email = email
        self.emailVerified = emailVerified
        self.realUserStatus = realUserStatus
        self.routes = routes
    }

    /// Parses one line; nil with the reason when it is not a transfer line.
    public static func parse(_ line: String) -> Result<TransferLine, MigrationError> {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] else {
            return .failure(MigrationError("not a JSON object"))
        }
        guard let id = object["transfer_sub"] as? String, !id.isEmpty, id.utf8.count <= 256 else { return .failure(MigrationError("transfer_sub is missing")) }
        let routes = object["routes"] as? [String] ?? []
        if let account = object["account"] as? String, !AuthEndpointGuard.isAccountID(account) {
            return .failure(MigrationError("account is not an account id (printable, at most \(AuthEndpointGuard.maximumAccountLength) bytes)"))
        }
        return .success(TransferLine(transferSubject: id, account: object["account"] as? String, name: object["name"] as? String,
                                     email: object["email"] as? String, emailVerified: object["email_verified"] as? Bool,
                                     realUserStatus: (object["real_user_status"] as? NSNumber)?.intValue, routes: routes))
    }

    public var json: String {
        var object: [String: Any] = ["transfer_sub": transferSubject]
        if let account { object["account"] = account }
        if let name { object["name"] = name }
        if let email { object["email"] = email }
        if let emailVerified { object["email_verified"] = emailVerified }
        if let realUserStatus { object["real_user_status"] = realUserStatus }
        if !routes.isEmpty { object["routes"] = routes }
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    /// What the recipient's move of the user reads from this line.
    var exported: TransferArrival.Exported {
        TransferArrival.Exported(account: account, name: name, email: email, emailVerified: emailVerified, realUserStatus: realUserStatus)
    }

    /// The line `migrate import` loaded into `record` (nil when none, or not a transfer line).
    static func exported(in record: TransferRecord) -> TransferArrival.Exported? {
        record.data.flatMap { try? parse($0).get() }?.exported
    }

    /// The non-empty lines of a transfer file with their numbers (from 1).
    static func lines(of file: String) throws -> [(Int, String)] {
        guard let data = FileManager.default.contents(atPath: file) else { throw MigrationError("\(file): cannot read") }
        return String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).enumerated()
            .compactMap { index, line in line.trimmingCharacters(in: .whitespaces).isEmpty ? nil : (index + 1, String(line)) }
    }
}
