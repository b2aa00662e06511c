"""NeMo-Gym's workplace-assistant workbench, run INSIDE the episode's sandbox (standard library only;
loaded by ``server.py``, never imported by the host).

Written from the behaviour of NeMo-Gym's ``resources_servers/workplace_assistant/workplace_assistant_tools``
(Apache-2.0; its pandas code is not used): five tables (``emails``, ``calendar_events``, ``project_tasks``,
``customer_relationship_manager_data``, the plots made) plus the analytics visits and the company
directory, read-only, and the 27 tools over them. Writes follow the workbench's rules (new ids one past the
largest, 8 digits except e-mails; e-mail addresses lower-cased; the allowed lists, boards, statuses and
products; the fixed clock 2023-11-30 23:59:00); every refusal is the workbench's message. Rows are dicts
of strings (``None`` for an empty cell), in table order.

:func:`compare` is the workbench's ``is_correct``: the five tables equal after NeMo-Gym's case rule (strings
lower-cased except ``status``, ``list_name``, ``board``). Deviation: tables compare as ordered rows, not
pandas frames with their index labels.
"""

import datetime
import json

NOW = "2023-11-30 23:59:00"
TABLES = ("emails", "calendar_events", "project_tasks", "customer_relationship_manager_data", "plots")
CASE_SENSITIVE = ("status", "list_name", "board")
LISTS = ["Backlog", "In Progress", "In Review", "Completed"]
BOARDS = ["Back end", "Front end", "Design"]
STATUSES = ["Qualified", "Won", "Lost", "Lead", "Proposal"]
PRODUCTS = ["Software", "Hardware", "Services", "Consulting", "Training"]
PLOT_VALUES = ["total_visits", "session_duration_seconds", "user_engaged", "visits_direct", "visits_referral",
               "visits_search_engine", "visits_social_media"]


def _time(text):
    return datetime.datetime.fromisoformat(str(text).strip())


def _page(items, key, page, page_size):
    total = len(items)
    pages = (total + page_size - 1) // page_size
    page = max(1, min(int(page), pages)) if pages else 1
    start = (page - 1) * page_size
    return {key: items[start:start + page_size],
            "pagination": {f"total_{key}": total, "page": page, "page_size": page_size, "total_pages": pages}}


def _contains(value, text):
    return value is not None and str(text).lower() in str(value).lower()


def _next_id(rows, key, width=8):
    ids = [r[key] for r in rows if r.get(key)]
    new = str(int(max(ids)) + 1) if ids else "1"
    return new.zfill(width) if width else new


class World:
    """Config ``{"tables": {name: [row, ...]}, "visits": [row, ...], "directory": [address, ...]}``."""

    def __init__(self, config):
        self.t = {name: [dict(r) for r in config["tables"].get(name, [])] for name in TABLES}
        self.initial = {name: [dict(r) for r in rows] for name, rows in self.t.items()}
        self.visits = config.get("visits", [])
        self.directory = config.get("directory", [])
        self.tools = {f"{kit}_{name}": getattr(self, f"{kit}_{name}") for kit, names in (
            ("email", ["get_email_information_by_id", "search_emails", "send_email", "delete_email",
                       "forward_email", "reply_email"]),
            ("calendar", ["get_event_information_by_id", "search_events", "create_event", "delete_event",
                          "update_event"]),
            ("analytics", ["engaged_users_count", "get_visitor_information_by_id", "create_plot",
                           "traffic_source_count", "total_visits_count", "get_average_session_duration"]),
            ("project_management", ["get_task_information_by_id", "search_tasks", "create_task", "delete_task",
                                    "update_task"]),
            ("customer_relationship_manager", ["search_customers", "update_customer", "add_customer",
                                               "delete_customer"]),
            ("company_directory", ["find_email_address"])) for name in names}

    def call(self, name, args, kwargs):
        fn = self.tools.get(name)
        if fn is None:
            return f"Error executing tool '{name}': no such tool"
        try:
            out = fn(*args, **{k: v for k, v in kwargs.items() if v is not None})
        except Exception as exc:  # the workbench returns a tool's error to the model
            return f"Error executing tool '{name}': {exc}"
        return out if isinstance(out, str) else json.dumps(out, default=str)

    def state(self):
        return self.t

    # -- email
    def email_get_email_information_by_id(self, email_id=None, field=None):
        return self._field(self.t["emails"], "email_id", email_id, field, "Email")

    def _field(self, rows, key, rid, field, what):
        if not rid:
            return f"{what} ID not provided."
        if not field:
            return "Field not provided."
        row = next((r for r in rows if r.get(key) == rid), None)
        if row is None:
            return f"{what} not found."
        return {field: row[field]} if field in row else f"Field '{field}' not found. Available fields: {', '.join(row)}"

    def email_search_emails(self, query="", date_min=None, date_max=None, page=1, page_size=5):
        words = str(query).lower().split()
        hits = [r for r in self.t["emails"]
                if all(w in f"{r.get('subject')} {r.get('body')} {r.get('sender/recipient')}".lower() for w in words)]
        hits.sort(key=lambda r: _time(r["sent_datetime"]), reverse=True)
        if date_min:
            hits = [r for r in hits if _time(r["sent_datetime"]).date() >= _time(date_min).date()]
        if date_max:
            hits = [r for r in hits if _time(r["sent_datetime"]).date() <= _time(date_max).date()]
        return _page(hits, "emails", page, int(page_size)) if hits else "No emails found."

    def email_send_email(self, recipient=None, subject=None, body=None):
        if not recipient or not subject or not body:
            return "Recipient, subject, or body not provided."
        if "@" not in recipient or "." not in recipient:
            return "Invalid recipient email address."
        self.t["emails"].append({"email_id": _next_id(self.t["emails"], "email_id", width=0), "inbox/outbox": "outbox",
                                 "sender/recipient": recipient.lower(), "subject": subject, "sent_datetime": NOW,
                                 "body": body})
        return "Email sent successfully."

    def email_delete_email(self, email_id=None):
        if not email_id:
            return "Email ID not provided."
        return self._delete("emails", "email_id", email_id, "Email deleted successfully.", "Email not found.")

    def _delete(self, table, key, rid, done, missing):
        rows = self.t[table]
        if not any(r.get(key) == rid for r in rows):
            return missing
        self.t[table] = [r for r in rows if r.get(key) != rid]
        return done

    def _email(self, email_id):
        return next((r for r in self.t["emails"] if r.get("email_id") == email_id), None)

    def email_forward_email(self, email_id=None, recipient=None):
        if not email_id or not recipient:
            return "Email ID or recipient not provided."
        if "@" not in recipient or "." not in recipient:
            return "Invalid recipient email address."
        email = self._email(email_id)
        if email is None:
            return "Email not found."
        self.email_send_email(recipient, f"FW: {email['subject']}", email["body"])
        return "Email forwarded successfully."

    def email_reply_email(self, email_id=None, body=None):
        if not email_id or not body:
            return "Email ID or body not provided."
        email = self._email(email_id)
        if email is None:
            return "Email not found."
        result = self.email_send_email(email["sender/recipient"], f"RE: {email['subject']}", body)
        return result if "Invalid" in result else "Email replied successfully."

    # -- calendar
    @staticmethod
    def _eight(rid):
        return isinstance(rid, str) and len(rid) == 8 and rid.isdigit()

    def calendar_get_event_information_by_id(self, event_id=None, field=None):
        if event_id and not self._eight(event_id):
            return "Invalid event ID format. Expected 8-digit ID."
        fields = ["event_id", "event_name", "participant_email", "event_start", "duration"]
        if field and field not in fields:
            return f"Invalid field. Available fields are: {', '.join(fields)}"
        return self._field(self.t["calendar_events"], "event_id", event_id, field, "Event")

    def calendar_search_events(self, query="", time_min=None, time_max=None, page=1, page_size=5):
        try:
            lo, hi = (_time(time_min) if time_min else None), (_time(time_max) if time_max else None)
        except ValueError:
            return "Invalid time format. Expected YYYY-MM-DD HH:MM:SS."
        hits = [r for r in self.t["calendar_events"]
                if _contains(r.get("event_name"), query) or _contains(r.get("participant_email"), query)]
        hits = [r for r in hits if (lo is None or _time(r["event_start"]) >= lo)
                and (hi is None or _time(r["event_start"]) <= hi)]
        hits.sort(key=lambda r: _time(r["event_start"]), reverse=True)
        return _page(hits, "events", page, int(page_size)) if hits else "No events found."

    def calendar_create_event(self, event_name=None, participant_email=None, event_start=None, duration=None):
        for value, what in ((event_name, "Event name"), (participant_email, "Participant email"),
                            (event_start, "Event start"), (duration, "Event duration")):
            if not value:
                return f"{what} not provided."
        refused = self._check_event("event_start", event_start) or self._check_event("duration", duration)
        if refused:
            return refused
        event_id = _next_id(self.t["calendar_events"], "event_id")
        self.t["calendar_events"].append({"event_id": event_id, "event_name": event_name,
                                          "participant_email": participant_email.lower(),
                                          "event_start": event_start, "duration": str(duration)})
        return event_id

    @staticmethod
    def _check_event(field, value):
        if field == "event_start":
            try:
                _time(value)
            except ValueError:
                return "Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS."
        if field == "duration":
            try:
                if int(value) <= 0:
                    return "Duration must be a positive number of minutes."
            except ValueError:
                return "Invalid duration format. Expected a number of minutes."
        return None

    def calendar_delete_event(self, event_id=None):
        if not event_id:
            return "Event ID not provided."
        if not self._eight(event_id):
            return "Invalid event ID format. Expected 8-digit ID."
        return self._delete("calendar_events", "event_id", event_id, "Event deleted successfully.", "Event not found.")

    def calendar_update_event(self, event_id=None, field=None, new_value=None):
        if not event_id or not field or not new_value:
            return "Event ID, field, or new value not provided."
        if not self._eight(event_id):
            return "Invalid event ID format. Expected 8-digit ID."
        fields = ["event_name", "participant_email", "event_start", "duration"]
        if field not in fields:
            return f"Invalid field. Available fields are: {', '.join(fields)}"
        refused = self._check_event(field, new_value)
        if refused:
            return refused
        new_value = new_value.lower() if field == "participant_email" else new_value
        return self._update("calendar_events", "event_id", event_id, field, new_value, "Event")

    def _update(self, table, key, rid, field, value, what):
        rows = [r for r in self.t[table] if r.get(key) == rid]
        if not rows:
            return f"{what} not found."
        for r in rows:
            r[field] = str(value)
        return f"{what} updated successfully."

    # -- analytics (visits are read-only; the plots made are state)
    def _visits(self, time_min, time_max):
        return [v for v in self.visits if (not time_min or v["date_of_visit"] >= time_min)
                and (not time_max or v["date_of_visit"] <= time_max)]

    def analytics_get_visitor_information_by_id(self, visitor_id=None):
        if not visitor_id:
            return "Visitor ID not provided."
        found = [v for v in self.visits if v.get("visitor_id") == visitor_id]
        return found or "Visitor not found."

    def analytics_create_plot(self, time_min=None, time_max=None, value_to_plot=None, plot_type=None):
        if not time_min:
            return "Start date not provided."
        if not time_max:
            return "End date not provided."
        if value_to_plot not in PLOT_VALUES:
            return f"Value to plot must be one of {', '.join(repr(v) for v in PLOT_VALUES)}"
        if plot_type not in ["bar", "line", "scatter", "histogram"]:
            return "Plot type must be one of 'bar', 'line', 'scatter', or 'histogram'"
        path = f"plots/{time_min}_{time_max}_{value_to_plot}_{plot_type}.png"
        self.t["plots"].append({"file_path": path})
        return path

    def _per_day(self, rows, value):
        out = {}
        for v in rows:
            out[v["date_of_visit"]] = out.get(v["date_of_visit"], 0) + value(v)
        return dict(sorted(out.items()))

    def analytics_total_visits_count(self, time_min=None, time_max=None):
        return self._per_day(self._visits(time_min, time_max), lambda v: 1)

    def analytics_engaged_users_count(self, time_min=None, time_max=None):
        return self._per_day(self._visits(time_min, time_max), lambda v: int(str(v.get("user_engaged")) == "True"))

    def analytics_traffic_source_count(self, time_min=None, time_max=None, traffic_source=None):
        return self._per_day(self._visits(time_min, time_max),
                             lambda v: int(not traffic_source or v.get("traffic_source") == traffic_source))

    def analytics_get_average_session_duration(self, time_min=None, time_max=None):
        rows = self._visits(time_min, time_max)
        sums, counts = self._per_day(rows, lambda v: float(v["session_duration_seconds"])), self._per_day(rows, lambda v: 1)
        return {d: sums[d] / counts[d] for d in sums}

    # -- project management
    def project_management_get_task_information_by_id(self, task_id=None, field=None):
        return self._field(self.t["project_tasks"], "task_id", task_id, field, "Task")

    def _team(self):
        return {str(r.get("assigned_to_email")).lower() for r in self.t["project_tasks"]}

    def project_management_search_tasks(self, task_name=None, assigned_to_email=None, list_name=None, due_date=None,
                                        board=None):
        if not any([task_name, assigned_to_email, list_name, due_date, board]):
            return "No search parameters provided."
        hits = self.t["project_tasks"]
        for col, value in (("task_name", task_name), ("list_name", list_name), ("due_date", due_date),
                           ("board", board)):
            if value:
                hits = [r for r in hits if _contains(r.get(col), value)]
        if assigned_to_email:
            hits = [r for r in hits if str(r.get("assigned_to_email")).lower() == assigned_to_email.lower()]
        return hits

    def project_management_create_task(self, task_name=None, assigned_to_email=None, list_name=None, due_date=None,
                                       board=None):
        if not all([task_name, assigned_to_email, list_name, due_date, board]):
            return "Missing task details."
        refused = self._check_task("assigned_to_email", assigned_to_email.lower()) or \
            self._check_task("list_name", list_name) or self._check_task("board", board)
        if refused:
            return refused
        task_id = _next_id(self.t["project_tasks"], "task_id")
        self.t["project_tasks"].append({"task_id": task_id, "task_name": task_name,
                                        "assigned_to_email": assigned_to_email.lower(), "list_name": list_name,
                                        "due_date": due_date, "board": board})
        return task_id

    def _check_task(self, field, value):
        if field == "assigned_to_email" and value not in self._team():
            return "Assignee email not valid. Please choose from the list of team members."
        if field == "list_name" and value not in LISTS:
            return "List not valid. Please choose from: 'Backlog', 'In Progress', 'In Review', 'Completed'."
        if field == "board" and value not in BOARDS:
            return "Board not valid. Please choose from: 'Back end', 'Front end', 'Design'."
        return None

    def project_management_delete_task(self, task_id=None):
        if not task_id:
            return "Task ID not provided."
        return self._delete("project_tasks", "task_id", task_id, "Task deleted successfully.", "Task not found.")

    def project_management_update_task(self, task_id=None, field=None, new_value=None):
        if not task_id or not field or not new_value:
            return "Task ID, field, or new value not provided."
        new_value = new_value.lower() if field == "assigned_to_email" else new_value
        refused = self._check_task(field, new_value)
        if refused:
            return refused
        if not any(r.get("task_id") == task_id for r in self.t["project_tasks"]):
            return "Task not found."
        if self.t["project_tasks"] and field not in self.t["project_tasks"][0]:
            return "Field not valid."
        return self._update("project_tasks", "task_id", task_id, field, new_value, "Task")

    # -- customer relationship manager
    def customer_relationship_manager_search_customers(self, page=1, page_size=5, **filters):
        known = ("customer_name", "customer_email", "product_interest", "status", "assigned_to_email",
                 "last_contact_date_min", "last_contact_date_max", "follow_up_by_min", "follow_up_by_max")
        unknown = sorted(set(filters) - set(known))
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
        if not any(filters.values()):
            return "No search parameters provided. Please provide at least one parameter."
        hits = self.t["customer_relationship_manager_data"]
        for col in known[:5]:
            if filters.get(col):
                hits = [r for r in hits if _contains(r.get(col), filters[col])]
        for col in ("last_contact_date", "follow_up_by"):
            lo, hi = filters.get(f"{col}_min"), filters.get(f"{col}_max")
            hits = [r for r in hits if (not lo or (r.get(col) or "") >= lo) and (not hi or (r.get(col) or "~") <= hi)]
        return _page(hits, "customers", page, int(page_size)) if hits else "No customers found."

    def customer_relationship_manager_update_customer(self, customer_id=None, field=None, new_value=None):
        if not customer_id or not field or not new_value:
            return "Customer ID, field, or new value not provided."
        if field == "status" and new_value not in STATUSES:
            return "Status not valid. Please choose from: 'Qualified', 'Won', 'Lost', 'Lead', 'Proposal'"
        if field == "product_interest" and new_value not in PRODUCTS:
            return ("Product interest not valid. Please choose from: 'Software', 'Hardware', 'Services', "
                    "'Consulting', 'Training'")
        new_value = new_value.lower() if field in ("customer_email", "assigned_to_email") else new_value
        rows = self.t["customer_relationship_manager_data"]
        if not any(r.get("customer_id") == customer_id for r in rows):
            return "Customer not found."
        if rows and field not in rows[0]:
            return "Field not valid."
        return self._update("customer_relationship_manager_data", "customer_id", customer_id, field, new_value,
                            "Customer")

    def customer_relationship_manager_add_customer(self, customer_name=None, assigned_to_email=None, status=None,
                                                   customer_email=None, customer_phone=None, last_contact_date=None,
                                                   product_interest=None, notes="", follow_up_by=None):
        if not all([customer_name, assigned_to_email, status]):
            return "Please provide all required fields: customer_name, assigned_to_email, status."
        new_id = _next_id(self.t["customer_relationship_manager_data"], "customer_id")
        self.t["customer_relationship_manager_data"].append({
            "customer_id": new_id, "customer_name": customer_name,
            "customer_email": customer_email.lower() if customer_email else customer_email,
            "customer_phone": customer_phone, "last_contact_date": last_contact_date,
            "product_interest": product_interest, "status": status, "assigned_to_email": assigned_to_email.lower(),
            "notes": notes, "follow_up_by": follow_up_by})
        return new_id

    def customer_relationship_manager_delete_customer(self, customer_id=None):
        if not customer_id:
            return "Customer ID not provided."
        return self._delete("customer_relationship_manager_data", "customer_id", customer_id,
                            "Customer deleted successfully.", "Customer not found.")

    # -- company directory
    def company_directory_find_email_address(self, name=""):
        if not name:
            return "Name not provided."
        return [a for a in self.directory if str(name).lower() in a.lower()]


def _cased(rows):
    return [{k: (v.lower() if isinstance(v, str) and k not in CASE_SENSITIVE else v) for k, v in r.items()}
            for r in rows]


def compare(model, reference):
    """``{"equal": bool, "differences": [table, ...], "reference_changed": bool}``: NeMo-Gym's ``is_correct``
    on the five tables, and whether the ground-truth calls changed any table at all."""
    diffs = [t for t in TABLES if _cased(model.t[t]) != _cased(reference.t[t])]
    changed = any(_cased(reference.t[t]) != _cased(reference.initial[t]) for t in TABLES)
    return {"equal": not diffs, "differences": diffs, "reference_changed": changed}
