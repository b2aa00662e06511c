"""ToolTalk's simulated APIs, run INSIDE the episode's sandbox (standard library only; loaded by
``server.py``, never imported by the host).

A world is ToolTalk's ``ToolExecutor`` state (``tooltalk/evaluation/tool_executor.py`` of
nvidia-tooltalk 26.3): the databases (copied from the config), one instance per API used, the
conversation's timestamp and the logged-in user's session token. A call is executed as ToolTalk
executes it: unknown API -> ``API ... not found``; an API that needs a login gets the session token
injected (the model never writes it); a second login is refused; ``RegisterUser``/``UserLogin`` set the
token and ``LogoutUser``/``DeleteAccount`` clear it. The result text is the JSON
``{"response": ..., "exception": ...}``; every call is logged as ToolTalk logs predictions.

:func:`compare` grades the model's log against the reference's (the ground-truth calls) with ToolTalk's
``evaluate_predictions`` rule (each ground-truth call matched at most once by
``API.check_api_call_correctness``, an action's other arguments exact (:func:`matches`); an action that
succeeded without matching is a bad action;
``success`` = recall 1 and no bad action), and compares the resulting databases (:func:`same_database`).
"""

import copy
import datetime
import json

FREE_TEXT_THRESHOLD = 0.8  # ToolTalk's lowest semantic threshold (message, email body)


class World:
    """Config ``{"databases": {name: {...}}, "timestamp": "YYYY-mm-dd HH:MM:SS", "user": {...}}``."""

    def __init__(self, config):
        from tooltalk.apis import ALL_APIS

        self.apis = {api.__name__: api for api in ALL_APIS}
        self.databases = copy.deepcopy(config["databases"])
        self.now = datetime.datetime.strptime(config["timestamp"], "%Y-%m-%d %H:%M:%S")
        self.session_token, self.tools, self.log = None, {}, []
        user = config.get("user") or {}
        accounts = self.databases.setdefault("Account", {})
        if "session_token" in user:
            self.session_token = user["session_token"]
            accounts[user["username"]]["session_token"] = user["session_token"]
        if "verification_code" in user:
            accounts[user["username"]]["verification_code"] = user["verification_code"]

    def tool(self, name):
        if name not in self.tools:
            cls = self.apis[name]
            kwargs = {"account_database": self.databases.get("Account"), "now_timestamp": self.now}
            if cls.database_name is not None:
                kwargs["api_database"] = self.databases.get(cls.database_name)
            self.tools[name] = cls(**kwargs)
        return self.tools[name]

    def execute(self, name, parameters):
        if name not in self.apis:
            return {"response": None, "exception": f"API {name} not found"}
        tool = self.tool(name)
        if tool.requires_auth:
            if self.session_token is None:
                return {"response": None, "exception": "User is not logged in"}
            parameters["session_token"] = self.session_token
        if name in ("UserLogin", "RegisterUser") and self.session_token is not None:
            user = tool.check_session_token(self.session_token)["username"]
            return {"response": None, "exception": f"Only one user can be logged in at a time. Current user is {user}."}
        response = tool(**parameters)
        if name in ("UserLogin", "RegisterUser") and response["exception"] is None:
            self.session_token = response["response"]["session_token"]
        elif name in ("LogoutUser", "DeleteAccount") and response["exception"] is None:
            self.session_token = None
        return response

    def call(self, name, args, kwargs):
        parameters = dict(kwargs)
        response = self.execute(name, parameters)
        self.log.append({"request": {"api_name": name, "parameters": parameters}, **response})
        return json.dumps({"response": response["response"], "exception": response["exception"]}, default=str)

    def state(self):
        return json.loads(json.dumps(self.databases, default=str))


def matches(world, prediction, truth):
    """ToolTalk's ``compare_api_calls`` (same API, then the API's own correctness check), and, for an action,
    every ground-truth argument that is not free text equal: ToolTalk's ``SendMessage`` check compares the
    prediction's receiver with itself, so a message to anyone would match."""
    name = prediction["request"]["api_name"]
    if name != truth["request"]["api_name"] or name not in world.apis:
        return False
    api = world.apis[name]
    if not api.check_api_call_correctness(prediction, truth):
        return False
    if not api.is_action:
        return True
    mine, theirs = prediction["request"]["parameters"], truth["request"]["parameters"]
    return all(key in FREE_TEXT or mine.get(key) == value for key, value in theirs.items())


#: the free-text fields ToolTalk's own checks compare semantically (calendar name/description/location,
#: e-mail subject/body, message text, reminder task); every other value must be equal
FREE_TEXT = frozenset({"name", "description", "location", "subject", "body", "message", "task"})


def same_value(a, b, key=None):
    """Equal, recursively; a string under a :data:`FREE_TEXT` key within ToolTalk's lowest threshold."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k], k) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y, key) for x, y in zip(a, b))
    if a == b:
        return True
    if key in FREE_TEXT and isinstance(a, str) and isinstance(b, str):
        from tooltalk.apis.utils import semantic_str_compare

        return semantic_str_compare(a, b) >= FREE_TEXT_THRESHOLD
    return False


def same_database(a, b):
    """The differing ``[table, key]`` pairs: every table has the same record keys, and every value is equal,
    free text (:data:`FREE_TEXT` fields) within ToolTalk's lowest similarity threshold."""
    diffs = []
    for table in sorted(set(a) | set(b)):
        ta, tb = a.get(table, {}), b.get(table, {})
        for key in sorted(set(ta) | set(tb), key=str):
            if not same_value(ta.get(key), tb.get(key)):
                diffs.append([table, str(key)])
    return diffs


def compare(model, reference):
    """ToolTalk's metrics of the model's calls against the reference's, and the database check."""
    pending = list(reference.log)
    matched = actions = bad = 0
    for prediction in model.log:
        hit = next((i for i, truth in enumerate(pending) if matches(model, prediction, truth)), None)
        if hit is not None:
            pending.pop(hit)
        name = prediction["request"]["api_name"]
        is_action = name in model.apis and bool(model.apis[name].is_action)
        matched += hit is not None
        actions += is_action
        bad += is_action and hit is None and prediction["exception"] is None
    recall = matched / len(reference.log) if reference.log else 1.0
    db = same_database(model.state(), reference.state())
    return {"success": recall == 1.0 and bad == 0, "recall": recall, "bad_actions": bad, "actions": actions,
            "predictions": len(model.log), "ground_truths": len(reference.log),
            "missing": [t["request"]["api_name"] for t in pending], "database_differences": db[:20],
            "equal": recall == 1.0 and bad == 0 and not db}
